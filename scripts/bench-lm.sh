#!/usr/bin/env bash
# The Llama inference figures (docs/benchmarks.md, "Llama inference") in one run:
# kiln's bench_lm (SmolLM2-135M's shape, random weights, f32: the FMA peak and
# the memory bandwidth measured in the same run, prefill of PREFILL tokens)
# and the same model in PyTorch (bench/lm_pytorch.py, Debian's python3-torch,
# OMP_WAIT_POLICY=PASSIVE, torch.set_num_threads(THREADS): prefill, and greedy
# generation with a KV cache at batch 1), alternated REPEATS times so that both
# see the same machine; prints each run's lines, then the medians and ratios
# against the targets. Logs stay in out/bench-lm/.
#   bash scripts/bench-lm.sh [REPEATS (1)] [THREADS (2)] [PREFILL (512)]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

repeats="${1:-1}" threads="${2:-2}" prefill="${3:-512}"
install_deps
build_preset bench_lm bench_generate

py="$(torch_python)"

bench="$KILN_ROOT/build/$KILN_PRESET/bench/bench_lm"
gen="$KILN_ROOT/build/$KILN_PRESET/bench/bench_generate"
out="$KILN_ROOT/out/bench-lm"
mkdir -p "$out"
log "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2), $(nproc) cores," \
  "commit $(git -C "$KILN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)," \
  "$threads threads, prefill $prefill, load $(cut -d' ' -f1-3 /proc/loadavg)"

# Median of the values of field $2 (name=value) on lines starting with $3 in file $1.
median() {
  grep "^$3" "$1" | sed -nE "s/.*[ :]$2=([0-9.]+).*/\\1/p" | sort -n |
    awk '{v[NR] = $1} END {if (!NR) print "nan"; else if (NR % 2) print v[(NR + 1) / 2];
                           else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {if (b > 0) printf "%.2f", a / b; else print "nan"}'; }

: >"$out/kiln.txt"
: >"$out/pytorch.txt"
for ((r = 1; r <= repeats; ++r)); do
  log "run $r/$repeats: kiln"
  "$bench" --threads "$threads" --prefill "$prefill" --repeats 3 >"$out/kiln-$r.log" 2>&1 ||
    die "bench_lm failed: $(tail -n3 "$out/kiln-$r.log")"
  grep -E '^(fma_peak|weights|prefill)' "$out/kiln-$r.log" | tee -a "$out/kiln.txt"
  # Decoding with the KV cache (kiln/generate.h): a 32-token prompt, then 64
  # greedy steps, as lm_pytorch.py's generation; the read bandwidth is measured
  # again in that process and the fraction is against it.
  "$gen" --threads "$threads" --prompt 32 --tokens 64 >"$out/generate-$r.log" 2>&1 ||
    die "bench_generate failed: $(tail -n3 "$out/generate-$r.log")"
  grep -E '^layers=' "$out/generate-$r.log" | sed 's/^/generate: /' | tee -a "$out/kiln.txt"
  log "run $r/$repeats: PyTorch"
  OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS="$threads" "$py" "$KILN_ROOT/bench/lm_pytorch.py" \
    --threads "$threads" --prefill "$prefill" --repeats 3 >"$out/pytorch-$r.log" 2>&1 ||
    die "lm_pytorch.py failed: $(tail -n3 "$out/pytorch-$r.log")"
  grep -E '^(prefill|generate)' "$out/pytorch-$r.log" | tee -a "$out/pytorch.txt"
done

k_prefill="$(median "$out/kiln.txt" tokens_per_s prefill)"
p_prefill="$(median "$out/pytorch.txt" tokens_per_s prefill)"
frac="$(median "$out/kiln.txt" peak_fraction prefill)"
ceiling="$(median "$out/kiln.txt" generation_ceiling_tokens_per_s weights)"
p_gen="$(median "$out/pytorch.txt" tokens_per_s generate)"
log "medians of $repeats:"
log "prefill $prefill tokens: kiln $k_prefill tokens/s ($frac of the FMA peak; target >= 0.70)," \
  "PyTorch $p_prefill tokens/s, ratio $(ratio "$k_prefill" "$p_prefill") (target >= 1.5)"
k_gen="$(median "$out/kiln.txt" decode_tokens_per_s generate)"
k_frac="$(median "$out/kiln.txt" fraction generate)"
log "generate (batch 1, KV cache, 64 tokens after 32): kiln $k_gen tokens/s," \
  "$(ratio "$k_gen" "$ceiling") of the ceiling $ceiling tokens/s from bench_lm's bandwidth," \
  "$k_frac of the bandwidth measured in its own process (target >= 0.85);" \
  "PyTorch $p_gen tokens/s, ratio $(ratio "$k_gen" "$p_gen") (target >= 2)"
