#!/usr/bin/env python3
"""PyTorch's bf16 and f32 matmul (oneDNN / MKL-DNN on CPU) on bench_gemm_bf16's shapes.

The baseline for the bf16 GEMM figures in docs/benchmarks.md: the same products
(sq1024 and the GPT example's default model, transposed operands as transposed
views, not copies), bf16 x bf16 -> bf16 as torch.matmul computes it (f32
accumulation inside oneDNN), and f32 for comparison. Prints one line per
shape and type: the median time of --reps timed repetitions and GFLOPS
(2*M*N*K / time).

  OMP_WAIT_POLICY=PASSIVE python3 bench/gemm_bf16_pytorch.py --threads 2

With --kiln-json (bench_gemm_bf16's --benchmark_out of the same session, with
repetitions: its medians are used) it ends with one markdown table of both:
kiln f32 and bf16, their ratio, bf16 as a share of the 2-thread vdpbf16ps peak
loop, and PyTorch's f32 and bf16 (bench/gemm_bf16_compare.sh runs the two).

OMP_WAIT_POLICY must be set before torch starts its OpenMP runtime (the script
sets PASSIVE when it is unset): with the default the idle OpenMP threads spin
and steal the core from whatever runs next.
"""
import argparse
import json
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

# name, M, N, K, A transposed, B transposed (as in bench/bench_gemm_bf16.cpp)
SHAPES = [
    ("sq1024", 1024, 1024, 1024, False, False),
    ("gpt_qkv_768x128x384_Bt", 768, 384, 128, False, True),
    ("gpt_qkv_dX_768x384x128", 768, 128, 384, False, False),
    ("gpt_qkv_dW_384x768x128_At", 384, 128, 768, True, False),
    ("gpt_proj_768x128x128_Bt", 768, 128, 128, False, True),
    ("gpt_proj_dX_768x128x128", 768, 128, 128, False, False),
    ("gpt_proj_dW_128x768x128_At", 128, 128, 768, True, False),
    ("gpt_up_768x128x512_Bt", 768, 512, 128, False, True),
    ("gpt_up_dX_768x512x128", 768, 128, 512, False, False),
    ("gpt_up_dW_512x768x128_At", 512, 128, 768, True, False),
    ("gpt_down_768x512x128_Bt", 768, 128, 512, False, True),
    ("gpt_down_dX_768x128x512", 768, 512, 128, False, False),
    ("gpt_down_dW_128x768x512_At", 128, 512, 768, True, False),
    ("gpt_head_768x128x256_Bt", 768, 256, 128, False, True),
    ("gpt_head_dX_768x256x128", 768, 128, 256, False, False),
    ("gpt_head_dW_256x768x128_At", 256, 128, 768, True, False),
]


def operand(rows, cols, transposed, dtype):
    """A rows x cols matrix; a transposed view of a cols x rows one when asked."""
    if transposed:
        return (torch.rand(cols, rows) * 2 - 1).to(dtype).t()
    return (torch.rand(rows, cols) * 2 - 1).to(dtype)


def time_matmul(a, b, min_time, reps):
    out = torch.matmul(a, b)  # warm-up (and oneDNN's primitive cache)
    times = []
    for _ in range(reps):
        n, t0 = 0, time.perf_counter()
        while True:
            torch.matmul(a, b, out=out)
            n += 1
            t = time.perf_counter() - t0
            if t >= min_time:
                break
        times.append(t / n)
    return statistics.median(times)


def kiln_medians(path):
    """{benchmark name: GFLOPS} of the median aggregates in a benchmark JSON file."""
    with open(path) as f:
        runs = json.load(f)["benchmarks"]
    out = {}
    for r in runs:
        if r.get("aggregate_name", "median") == "median" and "GFLOPS" in r:
            out[r["run_name"] if "run_name" in r else r["name"]] = r["GFLOPS"]
    return out


def table(kiln, torch_gflops, threads):
    peak = kiln.get(f"peak_bf16_vdpbf16ps/{threads}/real_time")
    f32_peak = kiln.get(f"peak_f32_vfmadd231ps/{threads}/real_time")
    if peak and f32_peak:
        print(f"\npeaks ({threads} threads): vdpbf16ps {peak:.0f} GFLOP/s, "
              f"vfmadd231ps {f32_peak:.0f} GFLOP/s")
    print("\n| shape | kiln f32 | kiln bf16 | bf16 / f32 | bf16 % of peak | PyTorch f32 | PyTorch bf16 |")
    print("|---|---|---|---|---|---|---|")
    for name, *_ in SHAPES:
        kf = kiln.get(f"BM_gemm/f32_{name}/{threads}/real_time")
        kb = kiln.get(f"BM_gemm/bf16_{name}/{threads}/real_time")
        tf, tb = torch_gflops.get((name, "f32")), torch_gflops.get((name, "bf16"))
        if kf is None or kb is None or tf is None:
            continue
        share = f"{100 * kb / peak:.0f}%" if peak else "-"
        print(f"| {name} | {kf:.0f} | {kb:.0f} | {kb / kf:.2f}x | {share} | {tf:.0f} | {tb:.0f} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--min-time", type=float, default=0.2, help="seconds per repetition")
    ap.add_argument("--only", default="", help="substring of the shape names to run")
    ap.add_argument("--kiln-json", default="", help="bench_gemm_bf16 JSON output to compare with")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1)
    print(f"torch {torch.__version__}, {args.threads} threads, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"mkldnn available: {torch.backends.mkldnn.is_available()}")
    print(f"{'shape':32s} {'type':5s} {'time_us':>10s} {'GFLOPS':>8s}")
    results = {}
    for name, M, N, K, ta, tb in SHAPES:
        if args.only not in name:
            continue
        for dtype, label in ((torch.float32, "f32"), (torch.bfloat16, "bf16")):
            a = operand(M, K, ta, dtype)
            b = operand(K, N, tb, dtype)
            t = time_matmul(a, b, args.min_time, args.reps)
            results[(name, label)] = 2e-9 * M * N * K / t
            print(f"{name:32s} {label:5s} {t * 1e6:10.1f} {results[(name, label)]:8.1f}")
    if args.kiln_json:
        table(kiln_medians(args.kiln_json), results, args.threads)


if __name__ == "__main__":
    main()
