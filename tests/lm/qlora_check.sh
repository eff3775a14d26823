#!/bin/bash
# kiln-lm finetune --quantize q4_0|q8_0 (QLoRA): LoRA adapters on a quantized,
# frozen byte-level base; the validation loss must fall by 10% and PEFT's files
# must be written.
#   qlora_check.sh KILN_LM BASE_DIR TEXT OUT_DIR TYPE
set -euo pipefail
lm=$1 base=$2 text=$3 out=$4 type=$5
rm -rf "$out"
line=$("$lm" finetune --model "$base" --out "$out" --quantize "$type" --lora-r 8 --lora-alpha 16 \
  --steps 30 --lr 1e-2 --data "$text" --bytes --batch 4 --seq 32 --warmup 4 --eval-every 15 \
  --eval-batches 4 --threads 2 | tail -1)
echo "$line"
awk -v l="$line" 'BEGIN {
  split(l, f, /[ =]/); start = f[2]; end = f[4];
  if (!(end <= 0.9 * start)) { print "validation loss did not fall: " start " -> " end; exit 1 } }'
test -s "$out/adapter_model.safetensors" || { echo "missing $out/adapter_model.safetensors"; exit 1; }
echo "qlora_check: ok"
