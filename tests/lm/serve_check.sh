#!/bin/bash
# kiln-lm serve end to end: a tiny Llama pretrained for two iterations with the
# real Llama-2 tokenizer and a chat template (which refuses system messages, so
# a template error can be provoked), served on a free port of 127.0.0.1 with 4
# sequences; kiln_serve_client then drives it (serve_client.cpp) and the
# server's log must show the disconnected client's request cancelled.
#   serve_check.sh KILN_LM CLIENT CORPUS_DIR TOKENIZER_DIR WORK_DIR
set -euo pipefail
lm=$1 client=$2 corpus=$3 tokenizer=$4 work=$5
rm -rf "$work"
mkdir -p "$work"
"$lm" pretrain --data "$corpus" --tokenizer "$tokenizer" --layers 1 --heads 2 --kv-heads 1 \
  --intermediate 32 --hidden 16 --block 16 --batch 4 --warmup 1 --eval-windows 8 --threads 1 \
  --iters 2 --eval-interval 2 --out "$work/model" --cache "$work/corpus.tok" >"$work/pretrain.log" 2>&1 ||
  { cat "$work/pretrain.log"; exit 1; }
printf '%s' "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"\
"{{ raise_exception('no system messages') }}{% elif m.role == 'user' %}[INST] {{ m.content }} [/INST]"\
"{% else %} {{ m.content }}</s>{% endif %}{% endfor %}" >"$work/model/chat_template.jinja"

ctx=2048
"$lm" serve --model "$work/model" --port 0 --parallel 4 --ctx $ctx --threads 1 >"$work/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
port=
for _ in $(seq 1 600); do
  port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/serve.log")
  [[ -n "$port" ]] && break
  kill -0 $server 2>/dev/null || { echo "the server exited:"; cat "$work/serve.log"; exit 1; }
  sleep 0.1
done
[[ -n "$port" ]] || { echo "the server did not start listening:"; cat "$work/serve.log"; exit 1; }
status=0
"$client" "$port" "$work/model" $ctx || status=$?
echo "--- server log"
cat "$work/serve.log"
[[ $status == 0 ]] || exit $status
grep -q "cancelled" "$work/serve.log" || { echo "no request was cancelled by its client leaving"; exit 1; }
kill -0 $server || { echo "the server died"; exit 1; }
echo "serve_check: ok"
