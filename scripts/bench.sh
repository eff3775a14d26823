#!/usr/bin/env bash
# Builds the `release` preset and runs every benchmark program in bench/ (GEMM vs
# OpenBLAS, elementwise vs a STREAM-like triad, graph per-node overhead) in one
# go, printing the machine it ran on first. Results go in docs/benchmarks.md.
#   bash scripts/bench.sh [Google Benchmark flags, e.g. --benchmark_filter=gemm]
# shellcheck source=scripts/common.sh
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

install_deps
build_preset

# The benchmark targets are stated for 2 threads (the project's machine); OpenBLAS reads this at start-up.
export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-2}"

log "machine"
grep -m1 'model name' /proc/cpuinfo || true
echo "cores: $(nproc), OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS, commit: $(git -C "$KILN_ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)"

bench_dir="$KILN_ROOT/build/$KILN_PRESET/bench"
found=0
for prog in "$bench_dir"/*; do
  [[ -f "$prog" && -x "$prog" ]] || continue
  found=1
  log "$(basename "$prog") $*"
  "$prog" "$@"
done
[[ "$found" == 1 ]] || die "no benchmark programs in $bench_dir (is KILN_BUILD_BENCH off?)"
