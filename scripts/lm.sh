#!/usr/bin/env bash
# The third main job: install what is missing, build kiln (preset `release`),
# fetch the State of the Union corpus (scripts/get-sotu.sh) and the Llama-2
# tokenizer (scripts/get-tokenizers.sh), pretrain a small Llama model from
# scratch (`kiln-lm pretrain`, defaults in examples/lm/pretrain.cpp) into the
# Hugging Face directory out/lm, then generate text from it (`kiln-lm generate`).
#   bash scripts/lm.sh [extra args for `kiln-lm pretrain`, e.g. --iters 200]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset
bash "$KILN_ROOT/scripts/get-sotu.sh"
bash "$KILN_ROOT/scripts/get-tokenizers.sh"

lm="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-lm"
[[ -x "$lm" ]] || die "$lm was not built (is KILN_BUILD_EXAMPLES or KILN_TOKENIZER off?)"
mkdir -p "$KILN_ROOT/out"
model="$KILN_ROOT/out/lm"
log "pretrain: kiln-lm pretrain --out out/lm $*"
"$lm" pretrain --data "$KILN_ROOT/data/sotu" --tokenizer "$KILN_ROOT/data/tokenizers/llama2" \
  --out "$model" "$@"
log "generate: kiln-lm generate --model out/lm"
"$lm" generate --model "$model" --prompt "Fellow citizens, the state of the Union" \
  --max-tokens 60 --temperature 0.8 --top-k 40 --seed 1
