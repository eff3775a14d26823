#!/usr/bin/env bash
# The GPT main job: install what is missing, build kiln (preset `release`), fetch
# the State of the Union corpus (scripts/get-sotu.sh) and train nanoGPT's CPU
# recipe (4 layers, 4 heads, 128 wide, block 64, batch 12, 2000 iterations) into
# out/gpt.gguf, then print a sample of generated text.
#   bash scripts/gpt.sh [extra args for `kiln-gpt train`, e.g. --iters 500]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset
bash "$KILN_ROOT/scripts/get-sotu.sh"

gpt="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-gpt"
[[ -x "$gpt" ]] || die "$gpt was not built (is KILN_BUILD_EXAMPLES off?)"
mkdir -p "$KILN_ROOT/out"
model="$KILN_ROOT/out/gpt.gguf"
log "train: kiln-gpt train --out out/gpt.gguf $*"
"$gpt" train --data "$KILN_ROOT/data/sotu" --out "$model" "$@"
log "sample: kiln-gpt sample --model out/gpt.gguf"
"$gpt" sample --model "$model" --prompt "Fellow citizens" --tokens 300
