#!/bin/bash
# kiln-lm finetune --quantize q4_0|q8_0 (QLoRA): LoRA adapters on a quantized,
# frozen byte-level base; the validation loss must fall by 10% and PEFT's files
# must be written. Then the same base written as a GGUF file of that type
# (kiln-lm quantize --pure) is fine-tuned directly (--model FILE.gguf, no
# --quantize: LoRA on the file's blocks as stored): the same blocks in memory,
# so the same adapter, byte for byte.
#   qlora_check.sh KILN_LM BASE_DIR TEXT OUT_DIR TYPE
set -euo pipefail
lm=$1 base=$2 text=$3 out=$4 type=$5
rm -rf "$out" "$out.base.gguf" "$out.from-gguf"
run=(--lora-r 8 --lora-alpha 16 --steps 30 --lr 1e-2 --data "$text" --bytes --batch 4 --seq 32
     --warmup 4 --eval-every 15 --eval-batches 4 --threads 2)
line=$("$lm" finetune --model "$base" --out "$out" --quantize "$type" "${run[@]}" | tail -1)
echo "$line"
awk -v l="$line" 'BEGIN {
  split(l, f, /[ =]/); start = f[2]; end = f[4];
  if (!(end <= 0.9 * start)) { print "validation loss did not fall: " start " -> " end; exit 1 } }'
test -s "$out/adapter_model.safetensors" || { echo "missing $out/adapter_model.safetensors"; exit 1; }

"$lm" quantize "$base" "$out.base.gguf" --type "$type" --pure --threads 2 > /dev/null
gguf_line=$("$lm" finetune --model "$out.base.gguf" --out "$out.from-gguf" "${run[@]}" | tail -1)
echo "$gguf_line"
cmp "$out/adapter_model.safetensors" "$out.from-gguf/adapter_model.safetensors" ||
  { echo "the adapter trained on the $type GGUF base differs from --quantize $type's"; exit 1; }
echo "qlora_check: ok"
