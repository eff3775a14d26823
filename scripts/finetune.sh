#!/usr/bin/env bash
# The fourth main job: fine-tune the model `bash scripts/lm.sh` pretrained
# (out/lm) on the late State of the Union addresses, with LoRA and, to
# compare, with every weight, then generate with and without the adapter.
#
# kiln-lm pretrain reads the addresses in date order and trains on the first
# 90% of the tokens (1790 to most of 1993's address), so the addresses from
# FROM_YEAR (default 1994) on are text the model has not trained on. The
# fine-tuning runs hold out the last 10% of those (the latest addresses) for
# validation. When out/lm is missing, this script runs scripts/lm.sh first
# (about 2 minutes more).
#   [STEPS=200] [FROM_YEAR=1994] bash scripts/finetune.sh [more options for both
#       `kiln-lm finetune` runs, e.g. --grad-accum 2 --checkpointing]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

from_year="${FROM_YEAR:-1994}" steps="${STEPS:-200}"
model="$KILN_ROOT/out/lm"
if [[ ! -f "$model/model.safetensors" ]]; then
  log "out/lm is missing: pretraining it first with scripts/lm.sh"
  bash "$KILN_ROOT/scripts/lm.sh"
fi
install_deps
build_preset kiln-lm
bash "$KILN_ROOT/scripts/get-sotu.sh"
lm="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-lm"
[[ -x "$lm" ]] || die "$lm was not built (is KILN_BUILD_EXAMPLES or KILN_TOKENIZER off?)"

late=()
for f in "$KILN_ROOT"/data/sotu/[12][0-9][0-9][0-9]_*.txt; do
  [[ -e "$f" ]] || continue  # the pattern itself when nothing matches
  name="$(basename "$f")"
  ((10#${name:0:4} >= from_year)) && late+=("$f")
done
((${#late[@]} > 1)) || die "fewer than 2 SOTU addresses from $from_year on in data/sotu"
log "late addresses: ${#late[@]} files, $(basename "${late[0]}") to $(basename "${late[-1]}")"

common=(--model "$model" --data "${late[@]}" --batch 8 --seq 128 --steps "$steps" --warmup 20
        --eval-every 50 --eval-batches 16 --threads 2)
run() {  # NAME ARGS...: one fine-tuning run; its summary line goes to out/NAME.txt
  local name=$1
  shift
  log "finetune ($name): kiln-lm finetune --out out/$name $*"
  "$lm" finetune "${common[@]}" --out "$KILN_ROOT/out/$name" "$@" | tee "$KILN_ROOT/out/$name.txt"
}
run lm-lora --lora-r 8 --lora-alpha 16 --lr 2e-3 "$@"
run lm-full --full --lr 3e-4 "$@"

field() { tr ' ' '\n' <"$KILN_ROOT/out/$1.txt" | sed -n "s/^$2=//p"; }
log "validation loss on the late addresses (the last 10% of $from_year on):"
printf '  %-22s %s\n' "before fine-tuning" "$(field lm-lora val_loss_start)" \
  "after LoRA r=8" "$(field lm-lora val_loss) ($(field lm-lora train_tokens_per_s) tokens/s, $(field lm-lora peak_rss_mb) MB peak RSS)" \
  "after full fine-tuning" "$(field lm-full val_loss) ($(field lm-full train_tokens_per_s) tokens/s, $(field lm-full peak_rss_mb) MB peak RSS)"

prompt="My fellow Americans, the state of our Union"
gen=(generate --model "$model" --prompt "$prompt" --max-tokens 60 --temperature 0.8 --top-k 40
     --seed 1 --threads 2)
log "generate without the adapter: kiln-lm generate --model out/lm"
"$lm" "${gen[@]}" 2>/dev/null
log "generate with the adapter: kiln-lm generate --model out/lm --adapter out/lm-lora"
"$lm" "${gen[@]}" --adapter "$KILN_ROOT/out/lm-lora" 2>/dev/null
