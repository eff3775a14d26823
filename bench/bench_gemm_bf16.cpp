// kiln::cpu::gemm with bf16 x bf16 inputs vs the same products in f32, in one
// run, and the two instruction peaks they are bounded by: a vfmadd231ps loop
// (f32) and a vdpbf16ps loop (bf16 pairs; AVX512_BF16 builds only). Counter
// GFLOPS = 2*M*N*K / time (a vdpbf16ps is 32 multiply-adds, an f32 FMA 16).
//
//   bench_gemm_bf16 --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//                   --benchmark_enable_random_interleaving=true
//
// Shapes: sq1024 and the GPT example's default model (as bench_gemm.cpp: M = 768
// tokens, each nn::Linear's forward x @ W^T, dX = dY @ W and dW = dY^T @ X),
// transposes as strided views. PyTorch's figures for the same shapes:
// bench/gemm_bf16_pytorch.py.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"
#endif

namespace {

using kiln::cpu::GemmArgs;
using kiln::cpu::GemmType;
using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

ThreadPool& pool(int n) {
  static std::unique_ptr<ThreadPool> p[3];
  if (!p[n]) p[n] = std::make_unique<ThreadPool>(n);
  return *p[n];
}

// --- instruction peaks ------------------------------------------------------

constexpr int kChains = 24;              // independent accumulators: hides latency
constexpr int64_t kPeakIters = 1 << 16;  // per thread and benchmark iteration

#if defined(KILN_GEMM_AVX512)
template <bool kBF16>
__attribute__((noinline)) float peak_loop(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 x = _mm512_set1_ps(1e-3f), y = _mm512_set1_ps(1e-3f);
#if defined(KILN_GEMM_BF16)
  const __m512bh xb = (__m512bh)_mm512_set1_epi32(0x3a833a83), yb = xb;  // bf16 pairs ~1e-3
#endif
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 24
    for (int i = 0; i < kChains; ++i) {
#if defined(KILN_GEMM_BF16)
      if constexpr (kBF16) acc[i] = _mm512_dpbf16_ps(acc[i], xb, yb);
      else acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
#else
      acc[i] = _mm512_fmadd_ps(x, y, acc[i]);
#endif
    }
  }
  __m512 s = acc[0];
  for (int i = 1; i < kChains; ++i) s = _mm512_add_ps(s, acc[i]);
  return _mm512_reduce_add_ps(s);
}

template <bool kBF16>
void BM_peak(benchmark::State& st) {
  const int threads = int(st.range(0));
  ThreadPool& p = pool(threads);
  float sink = 0;
  for (auto _ : st) {
    p.run([&](ThreadCtx& t) {
      const float r = peak_loop<kBF16>(kPeakIters);
      if (t.ith == 0) sink += r;
    });
    benchmark::DoNotOptimize(sink);
  }
  const double macs_per_instr = kBF16 ? 32 : 16;
  st.counters["GFLOPS"] =
      benchmark::Counter(2e-9 * macs_per_instr * kChains * double(kPeakIters) * threads,
                         benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK_TEMPLATE(BM_peak, false)->Name("peak_f32_vfmadd231ps")->Arg(2)->Arg(1)->UseRealTime();
#if defined(KILN_GEMM_BF16)
BENCHMARK_TEMPLATE(BM_peak, true)->Name("peak_bf16_vdpbf16ps")->Arg(2)->Arg(1)->UseRealTime();
#endif
#endif  // KILN_GEMM_AVX512

// --- GEMM -------------------------------------------------------------------

struct Shape {
  int64_t M, N, K;
  bool ta, tb;  // A / B given as transposed views
};

struct Data {
  std::vector<float> a, b, c;
  std::vector<uint16_t> a16, b16;  // a and b rounded to bf16
  explicit Data(const Shape& s) : a(s.M * s.K), b(s.K * s.N), c(s.M * s.N) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    for (float x : a) a16.push_back(kiln::f32_to_bf16(x));
    for (float x : b) b16.push_back(kiln::f32_to_bf16(x));
  }
};

// Storage: A is M x K row-major, or (ta) the K x M row-major matrix it is the
// transpose of; likewise B. `type` is the type of both; `rounded`: f32 operands
// the product reads rounded to bf16 (GemmOperand::round_bf16, how a training
// graph under the bf16 policy gives it weights and output gradients).
void BM_gemm(benchmark::State& st, Shape s, GemmType type, bool rounded = false) {
  const int threads = int(st.range(0));
  Data d(s);
  const bool bf = type == GemmType::bf16;
  GemmArgs args{s.M, s.N, s.K, {}, {}, d.c.data(), s.N};
  args.A = {bf ? static_cast<const void*>(d.a16.data()) : d.a.data(), type, s.ta ? 1 : s.K,
            s.ta ? s.M : 1};
  args.B = {bf ? static_cast<const void*>(d.b16.data()) : d.b.data(), type, s.tb ? 1 : s.N,
            s.tb ? s.K : 1};
  args.A.round_bf16 = args.B.round_bf16 = rounded;
  ThreadPool& p = pool(threads);
  auto fn = [&](ThreadCtx& t) { kiln::cpu::gemm(args, t); };
  for (auto _ : st) {
    p.run(fn);
    benchmark::DoNotOptimize(d.c.data());
    benchmark::ClobberMemory();
  }
  st.counters["GFLOPS"] = benchmark::Counter(2e-9 * double(s.M) * double(s.N) * double(s.K),
                                             benchmark::Counter::kIsIterationInvariantRate);
#if defined(KILN_GEMM_BF16)
  st.SetLabel(bf || rounded ? "vdpbf16ps" : kiln::cpu::gemm_detail::kIsa);
#else
  st.SetLabel(bf ? "bf16->f32" : kiln::cpu::gemm_detail::kIsa);
#endif
}

#define KILN_BF16_BENCH(name, ...)                                                    \
  BENCHMARK_CAPTURE(BM_gemm, f32_##name, Shape{__VA_ARGS__}, GemmType::f32)           \
      ->Arg(2)                                                                        \
      ->UseRealTime();                                                                \
  BENCHMARK_CAPTURE(BM_gemm, bf16_##name, Shape{__VA_ARGS__}, GemmType::bf16)         \
      ->Arg(2)                                                                        \
      ->UseRealTime();                                                                \
  BENCHMARK_CAPTURE(BM_gemm, rounded_##name, Shape{__VA_ARGS__}, GemmType::f32, true) \
      ->Arg(2)                                                                        \
      ->UseRealTime();

KILN_BF16_BENCH(sq1024, 1024, 1024, 1024, false, false)
KILN_BF16_BENCH(gpt_qkv_768x128x384_Bt, 768, 384, 128, false, true)
KILN_BF16_BENCH(gpt_qkv_dX_768x384x128, 768, 128, 384, false, false)
KILN_BF16_BENCH(gpt_qkv_dW_384x768x128_At, 384, 128, 768, true, false)
KILN_BF16_BENCH(gpt_proj_768x128x128_Bt, 768, 128, 128, false, true)
KILN_BF16_BENCH(gpt_proj_dX_768x128x128, 768, 128, 128, false, false)
KILN_BF16_BENCH(gpt_proj_dW_128x768x128_At, 128, 128, 768, true, false)
KILN_BF16_BENCH(gpt_up_768x128x512_Bt, 768, 512, 128, false, true)
KILN_BF16_BENCH(gpt_up_dX_768x512x128, 768, 128, 512, false, false)
KILN_BF16_BENCH(gpt_up_dW_512x768x128_At, 512, 128, 768, true, false)
KILN_BF16_BENCH(gpt_down_768x512x128_Bt, 768, 128, 512, false, true)
KILN_BF16_BENCH(gpt_down_dX_768x128x512, 768, 512, 128, false, false)
KILN_BF16_BENCH(gpt_down_dW_128x768x512_At, 128, 512, 768, true, false)
KILN_BF16_BENCH(gpt_head_768x128x256_Bt, 768, 256, 128, false, true)
KILN_BF16_BENCH(gpt_head_dX_768x256x128, 768, 128, 256, false, false)
KILN_BF16_BENCH(gpt_head_dW_256x768x128_At, 256, 128, 768, true, false)

}  // namespace

BENCHMARK_MAIN();
