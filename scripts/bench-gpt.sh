#!/usr/bin/env bash
# The GPT figures (docs/benchmarks.md) in one run: kiln-gpt against the same model and recipe in
# PyTorch (bench/gpt_pytorch.py, Debian's python3-torch, OMP_WAIT_POLICY=PASSIVE),
# both on the same number of threads, runs alternated so that both see the same
# machine; then kiln's sampling speed with and without the KV cache. Prints each
# run's summary line and the medians; each run's log (validation loss at every
# evaluation) stays in out/bench-gpt/. Results go in docs/benchmarks.md.
#   bash scripts/bench-gpt.sh [ITERS (2000)] [REPEATS (1)] [THREADS (2)]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

iters="${1:-2000}" repeats="${2:-1}" threads="${3:-2}"
install_deps
build_preset kiln-gpt
bash "$KILN_ROOT/scripts/get-sotu.sh"

py="$(torch_python)"

gpt="$KILN_ROOT/build/$KILN_PRESET/examples/kiln-gpt"
out="$KILN_ROOT/out/bench-gpt"
mkdir -p "$out"
log "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores," \
  "commit $(git -C "$KILN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "$iters iterations, $threads threads, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of the train_tokens_per_s= fields of the lines in file $1.
median_rate() {
  sed -nE 's/.*train_tokens_per_s=([0-9.]+).*/\1/p' "$1" | sort -n |
    awk '{v[NR] = $1} END {if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}

: >"$out/kiln.txt"
: >"$out/pytorch.txt"
for ((r = 1; r <= repeats; ++r)); do
  log "run $r/$repeats: PyTorch"
  OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" "$py" "$KILN_ROOT/bench/gpt_pytorch.py" \
    --data "$KILN_ROOT/data/sotu" --out "$out/gpt.pt" --threads "$threads" --iters "$iters" \
    >"$out/pytorch-$r.log"
  tail -n1 "$out/pytorch-$r.log" | tee -a "$out/pytorch.txt"
  log "run $r/$repeats: kiln"
  "$gpt" train --data "$KILN_ROOT/data/sotu" --out "$out/gpt.gguf" --threads "$threads" \
    --iters "$iters" >"$out/kiln-$r.log" 2>&1
  tail -n1 "$out/kiln-$r.log" | tee -a "$out/kiln.txt"
done
k="$(median_rate "$out/kiln.txt")" p="$(median_rate "$out/pytorch.txt")"
log "training tokens/s, median of $repeats: kiln $k, PyTorch $p, ratio $(awk -v k="$k" -v p="$p" 'BEGIN {printf "%.2f", k / p}')"

for mode in "" --no-cache; do
  log "sample ${mode:-(KV cache)}: 500 bytes"
  "$gpt" sample --model "$out/gpt.gguf" --threads "$threads" --prompt "Fellow citizens" \
    --tokens 500 --seed 1 $mode 2>&1 >/dev/null | grep '^sample:'
done
