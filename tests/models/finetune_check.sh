#!/bin/bash
# kiln-lm finetune end to end: LoRA then --full on a byte-level base model; each
# run's validation loss must fall by 10%, LoRA must write PEFT's files and
# --full a Hugging Face directory that kiln-lm finetune can start from again.
#   finetune_check.sh KILN_LM BASE_DIR TEXT OUT_DIR
set -euo pipefail
lm=$1 base=$2 text=$3 out=$4
rm -rf "$out"
mkdir -p "$out"
common=(--data "$text" --bytes --batch 4 --seq 32 --warmup 4 --eval-every 15 --eval-batches 4
        --threads 2)

check() {  # the summary line of a run: val_loss must fall to <= 90% of its start
  local line=$1
  echo "$line"
  awk -v l="$line" 'BEGIN {
    split(l, f, /[ =]/); start = f[2]; end = f[4];
    if (!(end <= 0.9 * start)) { print "validation loss did not fall: " start " -> " end; exit 1 } }'
}

line=$("$lm" finetune --model "$base" --out "$out/adapter" --lora-r 8 --lora-alpha 16 \
  --steps 30 --lr 1e-2 "${common[@]}" | tail -1)
check "$line"
for f in adapter_model.safetensors adapter_config.json; do
  test -s "$out/adapter/$f" || { echo "missing $out/adapter/$f"; exit 1; }
done
grep -q '"peft_type": "LORA"' "$out/adapter/adapter_config.json"

line=$("$lm" finetune --model "$base" --out "$out/full" --full --steps 30 --lr 3e-3 \
  "${common[@]}" | tail -1)
check "$line"
"$lm" finetune --model "$out/full" --out "$out/again" --steps 1 "${common[@]}" > /dev/null
echo "finetune_check: ok"
