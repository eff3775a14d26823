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
build_preset bench_lm

# Debian's torch is installed for Debian's own interpreter, not for one on PATH.
py=/usr/bin/python3
if ! "$py" -c 'import torch' 2>/dev/null; then
  have apt-get || die "python3-torch is missing and apt-get is not here"
  log "installing python3-torch (the baseline)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q python3-torch </dev/null >/dev/null
fi

bench="$KILN_ROOT/build/$KILN_PRESET/bench/bench_lm"
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
  grep -E '^(fma_peak|weights|prefill|generate)' "$out/kiln-$r.log" | tee -a "$out/kiln.txt"
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
# GENERATION: kiln's generation figure comes from the KV-cache API (kiln-lm
# generate); once it is merged, measure it here on the same machine and print
# its tokens/s against 0.85 x the ceiling and 2 x PyTorch.
log "generate (batch 1, KV cache): kiln not measured yet (KV-cache API);" \
  "ceiling $ceiling tokens/s (target >= 0.85 of it)," \
  "PyTorch $p_gen tokens/s (target >= 2x: $(awk -v p="$p_gen" 'BEGIN {printf "%.2f", 2 * p}'))"
