#!/bin/bash
# The bf16 GEMM figures of docs/benchmarks.md in one session: kiln's
# bench_gemm_bf16 (f32 and bf16 products, the two peak loops), then PyTorch's
# matmul on the same shapes, then one markdown table of both.
#   bash bench/gemm_bf16_compare.sh [BUILD_DIR (default build/release)]
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD="${1:-build/release}"
OUT="$(mktemp -d)"
"$BUILD/bench/bench_gemm_bf16" --benchmark_repetitions=5 --benchmark_report_aggregates_only=true \
  --benchmark_enable_random_interleaving=true \
  --benchmark_out="$OUT/kiln.json" --benchmark_out_format=json
OMP_WAIT_POLICY=PASSIVE python3 bench/gemm_bf16_pytorch.py --threads 2 --kiln-json "$OUT/kiln.json"
rm -rf "$OUT"
