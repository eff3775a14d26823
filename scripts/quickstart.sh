#!/usr/bin/env bash
# Quick start, command 1: install what is missing, build kiln (Release, Ninja,
# preset `release`), fetch MNIST and run the main job: train the `fc` model
# (784-500-10, AdamW, 30 epochs) and evaluate it on the test set.
#   bash scripts/quickstart.sh [extra args for `kiln-mnist train`, e.g. --epochs 5]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset
bash "$KILN_ROOT/scripts/get-mnist.sh"

mnist="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-mnist"
[[ -x "$mnist" ]] || die "$mnist was not built (is KILN_BUILD_EXAMPLES off?)"
mkdir -p "$KILN_ROOT/out"
model="$KILN_ROOT/out/mnist-fc.gguf"
log "train: kiln-mnist train --model fc --out out/mnist-fc.gguf $*"
"$mnist" train --model fc --data "$KILN_ROOT/data/mnist" --out "$model" "$@"
log "evaluate: kiln-mnist eval --model out/mnist-fc.gguf"
"$mnist" eval --model "$model" --data "$KILN_ROOT/data/mnist"
