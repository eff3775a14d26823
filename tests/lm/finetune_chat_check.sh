#!/bin/bash
# kiln-lm finetune on JSONL chat data end to end: a tiny Llama (pretrained for
# two iterations with the real Llama-2 tokenizer) given a chat template, then
# fine-tuned on conversations whose user turns are random words and whose
# replies are always "yes". Checks:
# - only the assistant's tokens count: trained_tokens is 2 per assistant turn
#   (" yes" and "</s>"; the template's [INST] ... [/INST] never), and
#   --train-on all counts more;
# - the masked validation loss falls (to <= 20% of the base model's);
# - a run stopped and resumed (LoRA, --grad-accum 2) writes the same adapter
#   as an uninterrupted one;
# - a bad line is an error naming the file and line.
#   finetune_chat_check.sh KILN_LM CORPUS_DIR TOKENIZER_DIR OUT_DIR
set -euo pipefail
lm=$1 corpus=$2 tokenizer=$3 out=$4
rm -rf "$out"
mkdir -p "$out"
"$lm" pretrain --data "$corpus" --tokenizer "$tokenizer" --layers 1 --heads 2 --kv-heads 1 \
  --intermediate 32 --hidden 16 --block 32 --batch 4 --warmup 1 --eval-windows 8 --threads 1 \
  --iters 2 --eval-interval 2 --out "$out/model" --cache "$out/corpus.tok" > /dev/null 2>&1
printf '%s' "{{ bos_token }}{% for m in messages %}{% if m.role == 'user' %}[INST] {{ m.content }} [/INST]{% else %} {{ m.content }}</s>{% endif %}{% endfor %}" \
  > "$out/model/chat_template.jinja"

# 40 conversations (every 5th has two turns): 45 assistant turns.
words=(apple river stone cloud paper lamp tiger honey glass mountain violet ocean copper maple
       candle garden silver winter basket rocket)
turns=0
for i in $(seq 0 39); do
  a=${words[$((i % 20))]} b=${words[$(((i * 7 + 3) % 20))]}
  if ((i % 5 == 0)); then
    echo "{\"messages\": [{\"role\": \"user\", \"content\": \"$a $b\"}, {\"role\": \"assistant\", \"content\": \"yes\"}, {\"role\": \"user\", \"content\": \"$b\"}, {\"role\": \"assistant\", \"content\": \"yes\"}]}"
  else
    echo "{\"messages\": [{\"role\": \"system\", \"content\": \"agree\"}, {\"role\": \"user\", \"content\": \"$b $a $b\"}, {\"role\": \"assistant\", \"content\": \"yes\"}]}"
  fi
done > "$out/all.jsonl"
head -32 "$out/all.jsonl" > "$out/train.jsonl"
tail -8 "$out/all.jsonl" > "$out/val.jsonl"
train_turns=$(grep -o '"assistant"' "$out/train.jsonl" | wc -l)

field() { tr " " "\n" <<<"$2" | sed -n "s/^$1=//p"; }
common=(--model "$out/model" --data "$out/train.jsonl" --val "$out/val.jsonl" --batch 4
        --seq 64 --warmup 2 --eval-batches 2 --threads 2)

line=$("$lm" finetune "${common[@]}" --out "$out/full" --full --steps 60 --eval-every 30 \
  --lr 1e-2 | tail -1)
echo "full: $line"
[[ $(field trained_tokens "$line") == $((2 * train_turns)) ]] ||
  { echo "trained_tokens is not 2 per assistant turn ($train_turns turns)"; exit 1; }
awk -v s="$(field val_loss_start "$line")" -v e="$(field val_loss "$line")" \
  'BEGIN { if (!(e <= 0.5 * s)) { print "val_loss did not fall: " s " -> " e; exit 1 } }'

all=$("$lm" finetune "${common[@]}" --out "$out/all" --full --steps 1 --train-on all | tail -1)
(($(field trained_tokens "$all") > 2 * train_turns)) ||
  { echo "--train-on all counts no more tokens: $all"; exit 1; }

# Exact resume with LoRA and gradient accumulation; --val-fraction instead of --val.
lora=(--model "$out/model" --data "$out/all.jsonl" --val-fraction 0.2 --batch 2 --grad-accum 2
      --seq 64 --warmup 2 --eval-batches 2 --threads 2 --steps 8 --eval-every 4 --lr 1e-2)
a=$("$lm" finetune "${lora[@]}" --out "$out/lora-a" | tail -1)
"$lm" finetune "${lora[@]}" --out "$out/lora-b" --checkpoint "$out/lora.ckpt.gguf" \
  --stop-after 3 > /dev/null
b=$("$lm" finetune "${lora[@]}" --out "$out/lora-b" --checkpoint "$out/lora.ckpt.gguf" \
  --resume | tail -1)
echo "lora straight: $a"
echo "lora resumed:  $b"
cmp "$out/lora-a/adapter_model.safetensors" "$out/lora-b/adapter_model.safetensors" ||
  { echo "the resumed adapter differs"; exit 1; }

# A GGUF base (the model as an f32 GGUF file; its vocabulary from the file,
# the chat template from --tokenizer): the same assistant tokens count, and
# --full --out FILE.gguf writes a GGUF model that generate loads.
"$lm" quantize "$out/model" "$out/model.gguf" --type f32 --threads 2 > /dev/null
g=$("$lm" finetune --model "$out/model.gguf" --tokenizer "$out/model" --data "$out/train.jsonl" \
  --val "$out/val.jsonl" --batch 4 --seq 64 --warmup 2 --eval-batches 2 --threads 2 --full \
  --steps 2 --eval-every 2 --out "$out/full.gguf" | tail -1)
echo "gguf base: $g"
[[ $(field trained_tokens "$g") == $((2 * train_turns)) ]] ||
  { echo "the GGUF base counts other tokens: $g"; exit 1; }
"$lm" generate --model "$out/full.gguf" --prompt "apple" --max-tokens 2 --threads 1 > /dev/null ||
  { echo "the fine-tuned GGUF model does not load"; exit 1; }

# A bad line: the error names the file and the line.
{ head -3 "$out/train.jsonl"; echo '{"messages": [{"role": "robot", "content": "x"}]}'; } \
  > "$out/bad.jsonl"
if err=$("$lm" finetune --model "$out/model" --data "$out/bad.jsonl" --val "$out/val.jsonl" \
  --out "$out/x" --steps 1 2>&1); then
  echo "a bad role was accepted"; exit 1
fi
grep -q "bad.jsonl:4: messages\[0\] has the unknown role \"robot\"" <<<"$err" ||
  { echo "unclear error: $err"; exit 1; }
echo "finetune_chat_check: ok"
