#!/bin/bash
# kiln-lm finetune end to end: LoRA then --full on a byte-level base model; each
# run's validation loss must fall by 10%, LoRA must write PEFT's files and
# --full a Hugging Face directory that kiln-lm finetune can start from again.
# A run stopped and resumed from its checkpoint (LoRA with dropout, gradient
# accumulation and checkpointing; and --full) writes the same bytes as an
# uninterrupted one; LoRA under --precision bf16 learns as f32 does; the
# adapter lowers the perplexity kiln-lm perplexity computes with --adapter, and
# kiln-lm generate runs with it; perplexity and generate --precision bf16 agree;
# the adapter as a GGUF file (finetune --out FILE.gguf, export-adapter) is the same.
#   finetune_check.sh KILN_LM BASE_DIR TEXT OUT_DIR
set -euo pipefail
lm=$1 base=$2 text=$3 out=$4
rm -rf "$out"
mkdir -p "$out"
common=(--data "$text" --bytes --batch 4 --seq 32 --warmup 4 --eval-batches 4
        --threads 2)

check() {  # the summary line of a run: val_loss must fall to <= 90% of its start
  local line=$1
  echo "$line"
  awk -v l="$line" 'BEGIN {
    split(l, f, /[ =]/); start = f[2]; end = f[4];
    if (!(end <= 0.9 * start)) { print "validation loss did not fall: " start " -> " end; exit 1 } }'
}

line=$("$lm" finetune --model "$base" --out "$out/adapter" --lora-r 8 --lora-alpha 16 \
  --steps 30 --eval-every 15 --lr 1e-2 "${common[@]}" | tail -1)
check "$line"
for f in adapter_model.safetensors adapter_config.json; do
  test -s "$out/adapter/$f" || { echo "missing $out/adapter/$f"; exit 1; }
done
grep -q '"peft_type": "LORA"' "$out/adapter/adapter_config.json"

# The same LoRA run under the bf16 precision policy: it learns as f32 does.
lora_f32=$line
line=$("$lm" finetune --model "$base" --out "$out/adapter-bf16" --lora-r 8 --lora-alpha 16 \
  --steps 30 --eval-every 15 --lr 1e-2 --precision bf16 "${common[@]}" | tail -1)
check "$line"
awk -v a="$lora_f32" -v b="$line" 'BEGIN {
  split(a, f, /[ =]/); split(b, g, /[ =]/); d = g[4] - f[4]; if (d < 0) d = -d;
  if (!(d <= 0.05 * f[4])) { print "bf16 val_loss " g[4] " is not within 5% of f32 " f[4]; exit 1 } }'

line=$("$lm" finetune --model "$base" --out "$out/full" --full --steps 30 --eval-every 15 --lr 3e-3 \
  "${common[@]}" | tail -1)
check "$line"
"$lm" finetune --model "$out/full" --out "$out/again" --steps 1 "${common[@]}" > /dev/null

# Exact resume: 12 steps straight against 5, stop, resume, 7 more.
field() { tr " " "\n" <<<"$2" | sed -n "s/^$1=//p"; }
resume_check() {  # NAME ARGS...: the run's outputs and validation losses must be equal
  local name=$1
  shift
  local a b
  a=$("$lm" finetune --model "$base" --out "$out/$name-a" --steps 12 --eval-every 4 "$@" \
    "${common[@]}" | tail -1)
  "$lm" finetune --model "$base" --out "$out/$name-b" --steps 12 --eval-every 4 "$@" \
    --checkpoint "$out/$name.ckpt.gguf" --stop-after 5 "${common[@]}" > /dev/null
  b=$("$lm" finetune --model "$base" --out "$out/$name-b" --steps 12 --eval-every 4 "$@" \
    --checkpoint "$out/$name.ckpt.gguf" --resume "${common[@]}" | tail -1)
  echo "$name straight: $a"
  echo "$name resumed:  $b"
  for f in "$out/$name-a"/*.safetensors; do
    cmp "$f" "$out/$name-b/$(basename "$f")" || { echo "$name: resumed $f differs"; exit 1; }
  done
  [[ $(field val_loss "$a") == $(field val_loss "$b") ]] || { echo "$name: val_loss differs"; exit 1; }
}
resume_check lora --lora-dropout 0.1 --grad-accum 2 --checkpointing --lr 1e-2
resume_check full --full --lr 3e-3
[[ $(field peak_rss_mb "$line") =~ ^[0-9.]+$ && $(field train_tokens_per_s "$line") =~ ^[0-9]+$ ]] ||
  { echo "summary line incomplete: $line"; exit 1; }
# Resuming with other settings is refused, naming the reason.
if err=$("$lm" finetune --model "$base" --out "$out/x" --steps 12 --lora-r 4 --resume \
  --checkpoint "$out/lora.ckpt.gguf" "${common[@]}" 2>&1 >/dev/null); then
  echo "resuming with another --lora-r succeeded"; exit 1
fi
grep -q "was written by another run" <<<"$err" || { echo "unclear error: $err"; exit 1; }

# The adapter, loaded by perplexity and generate: the text's tail is better predicted.
tail -c 3000 "$text" | od -An -tu1 -v > "$out/tail.ids"
ppl() { "$lm" perplexity --model "$base" --ids "$out/tail.ids" --ctx 64 --threads 2 "$@" |
  sed -n 's/.*perplexity=\([0-9.]*\).*/\1/p'; }
p0=$(ppl) p1=$(ppl --adapter "$out/adapter")
echo "perplexity of the text's tail: base $p0, with the adapter $p1"
awk -v a="$p0" -v b="$p1" 'BEGIN { exit !(b > 0 && b < 0.9 * a) }' ||
  { echo "the adapter does not lower the perplexity"; exit 1; }
# Inference under --precision bf16 (bf16 matrices, bf16 products): the same
# perplexity within 2%, with and without the adapter; generate runs.
p0b=$(ppl --precision bf16) p1b=$(ppl --precision bf16 --adapter "$out/adapter")
echo "perplexity under --precision bf16: base $p0b, with the adapter $p1b"
awk -v a="$p0" -v b="$p0b" -v c="$p1" -v d="$p1b" 'BEGIN {
  exit !(b > 0.98 * a && b < 1.02 * a && d > 0.98 * c && d < 1.02 * c) }' ||
  { echo "--precision bf16 changes the perplexity by more than 2%"; exit 1; }
"$lm" generate --model "$base" --precision bf16 --prompt-ids 84,104,101 --print-ids \
  --temperature 0 --max-tokens 8 --threads 2 | grep -q "new ids: [0-9]" ||
  { echo "generate --precision bf16 printed no ids"; exit 1; }
"$lm" generate --model "$base" --adapter "$out/adapter" --prompt-ids 84,104,101 --print-ids \
  --temperature 0 --max-tokens 8 --threads 2 | grep -q "new ids: [0-9]" ||
  { echo "generate --adapter printed no ids"; exit 1; }
# The adapter as one GGUF file in llama.cpp's format: finetune --out FILE.gguf
# writes what export-adapter makes of the same run's PEFT directory, which
# converts back to the same tensors; generate gives the same ids with either.
"$lm" finetune --model "$base" --out "$out/adapter.gguf" --lora-r 8 --lora-alpha 16 \
  --steps 30 --eval-every 15 --lr 1e-2 "${common[@]}" > /dev/null
"$lm" export-adapter "$out/adapter" "$out/exported.gguf" --model "$base" > /dev/null
cmp "$out/adapter.gguf" "$out/exported.gguf" || { echo "finetune's GGUF adapter differs"; exit 1; }
"$lm" export-adapter "$out/adapter.gguf" "$out/adapter-back" --model "$base" > /dev/null
cmp "$out/adapter/adapter_model.safetensors" "$out/adapter-back/adapter_model.safetensors" ||
  { echo "GGUF -> PEFT changed the tensors"; exit 1; }
gen_ids() { "$lm" generate --model "$base" --adapter "$1" --prompt-ids 84,104,101 --print-ids \
  --temperature 0 --max-tokens 8 --threads 2 | sed -n 's/^new ids://p'; }
[[ -n $(gen_ids "$out/adapter.gguf") && $(gen_ids "$out/adapter.gguf") == $(gen_ids "$out/adapter") ]] ||
  { echo "generate --adapter FILE.gguf differs from the PEFT directory's ids"; exit 1; }
echo "finetune_check: ok"
