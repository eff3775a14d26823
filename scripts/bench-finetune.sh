#!/usr/bin/env bash
# The fine-tuning figures (docs/benchmarks.md, "Fine-tuning") in one run:
# kiln's bench_finetune (SmolLM2-135M's shape, random f32 weights) with LoRA
# r=8 on q,k,v,o,gate,up,down and with full fine-tuning, and the same model
# and LoRA in PyTorch 1.13 (bench/finetune_pytorch.py, OMP_WAIT_POLICY=PASSIVE,
# torch.set_num_threads(THREADS)), each configuration in its own process (peak
# RSS is per process), kiln and PyTorch alternated REPEATS times so that both
# see the same machine; prints the runs' lines, then one table of medians.
# kiln's LoRA on a Q4_0 base (bench_finetune --mode qlora) runs too, plain and
# with gradient checkpointing (qlora_ckpt); PyTorch 1.13 has no Q4_0 kernels, so
# those rows have no baseline. Logs stay in out/bench-finetune/.
#   bash scripts/bench-finetune.sh [REPEATS (1)] [THREADS (2)] [STEPS (3)] [BATCH (1)] [SEQ (256)]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

repeats="${1:-1}" threads="${2:-2}" steps="${3:-3}" batch="${4:-1}" seq="${5:-256}"
install_deps
build_preset bench_finetune

py="$(torch_python)"

bench="$KILN_ROOT/build/$KILN_PRESET/bench/bench_finetune"
out="$KILN_ROOT/out/bench-finetune"
mkdir -p "$out"
log "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores," \
  "commit $(git -C "$KILN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "$threads threads, batch $batch, seq $seq, $steps timed steps, load $(cut -d' ' -f1-3 /proc/loadavg)"

modes=(lora full qlora qlora_ckpt)
common=(--threads "$threads" --steps "$steps" --batch "$batch" --seq "$seq")
: >"$out/runs.txt"
for ((r = 1; r <= repeats; ++r)); do
  for mode in "${modes[@]}"; do
    log "run $r/$repeats: kiln $mode"
    args=(--mode "$mode")
    [[ "$mode" == qlora_ckpt ]] && args=(--mode qlora --checkpointing)
    "$bench" "${args[@]}" "${common[@]}" >"$out/kiln-$mode-$r.log" 2>&1 ||
      die "bench_finetune ${args[*]} failed: $(tail -n3 "$out/kiln-$mode-$r.log")"
    grep '^finetune:' "$out/kiln-$mode-$r.log" | sed "s/^/kiln /; s/ mode=[a-z]* / mode=$mode /" |
      tee -a "$out/runs.txt"
    [[ "$mode" == qlora* ]] && continue
    log "run $r/$repeats: PyTorch $mode"
    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" "$py" \
      "$KILN_ROOT/bench/finetune_pytorch.py" --mode "$mode" "${common[@]}" \
      >"$out/pytorch-$mode-$r.log" 2>&1 ||
      die "finetune_pytorch.py --mode $mode failed: $(tail -n3 "$out/pytorch-$mode-$r.log")"
    grep '^finetune:' "$out/pytorch-$mode-$r.log" | sed 's/^/pytorch /' | tee -a "$out/runs.txt"
  done
done

# Median of field $3 (name=value) over the lines of runner $1 with mode $2.
median() {
  { grep "^$1 finetune: mode=$2 " "$out/runs.txt" || true; } | sed -nE "s/.* $3=([0-9.]+).*/\\1/p" | sort -n |
    awk '{v[NR] = $1} END {if (!NR) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                           else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b + 0 > 0) printf "%.2fx", a / b; else print "-"}'; }

k_full_rss="$(median kiln full peak_rss_mb)"
k_lora_tps="$(median kiln lora tokens_per_s)"
log "medians of $repeats (SmolLM2-135M shape, f32, batch $batch x seq $seq, $threads threads):"
printf '%-22s %12s %14s %12s %14s\n' "configuration" "tokens/s" "vs PyTorch" "peak RSS MB" "RSS vs full"
for mode in "${modes[@]}"; do
  tps="$(median kiln "$mode" tokens_per_s)" rss="$(median kiln "$mode" peak_rss_mb)"
  p_tps="$(median pytorch "$mode" tokens_per_s)"
  label="kiln $mode"
  [[ "$mode" == lora ]] && label="kiln LoRA r=8"
  [[ "$mode" == qlora ]] && label="kiln QLoRA (Q4_0)"
  [[ "$mode" == qlora_ckpt ]] && label="kiln QLoRA + ckpt"
  printf '%-22s %12s %14s %12s %14s\n' "$label" "$tps" "$(ratio "$tps" "$p_tps")" "$rss" \
    "$(ratio "$rss" "$k_full_rss")"
done
for mode in lora full; do
  printf '%-22s %12s %14s %12s %14s\n' "PyTorch $mode" "$(median pytorch "$mode" tokens_per_s)" \
    "" "$(median pytorch "$mode" peak_rss_mb)" ""
done
log "targets: LoRA >= 2x PyTorch's LoRA tokens/s; peak RSS LoRA <= 0.45x full, QLoRA <= 0.25x full;" \
  "kiln LoRA vs kiln full tokens/s: $(ratio "$k_lora_tps" "$(median kiln full tokens_per_s)")"
