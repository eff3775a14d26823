// kiln::cpu::gemm vs OpenBLAS cblas_sgemm (when found) on the shapes below, at 2
// threads (and 1 for reference). Counter GFLOPS = 2*M*N*K / time.
//
//   bench_gemm --benchmark_repetitions=7 --benchmark_report_aggregates_only=true
//              --benchmark_enable_random_interleaving=true
//
// Shapes (row-major storage as in an MLP layer, transposes as strided views):
//   sq1024   C[1024,1024] = A[1024,1024] @ B[1024,1024]
//   fwd      x@W1:   M=500 (batch), K=784, N=500
//   dW       X^T@dY: M=784, K=500, N=500, A = X^T a transposed view of X[500,784]
//   dX       dY@W^T: M=500, K=500, N=784, B = W^T a transposed view of W[784,500]
//   gpt_*    the GPT example's default model (n_embd 128, B*T = 768 tokens): each
//            kiln::nn::Linear y = x @ W^T with W [out, in] (B a transposed view),
//            its dX = dY @ W and dW = dY^T @ X (A a transposed view), for
//            (in, out) = (128, 384) qkv, (128, 128) attention projection,
//            (128, 512) MLP up, (512, 128) MLP down, (128, 256) tied LM head.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/thread_pool.h"

#if defined(KILN_BENCH_HAVE_BLAS)
#include <cblas.h>
extern "C" void openblas_set_num_threads(int) __attribute__((weak));
#endif

namespace {

using kiln::cpu::GemmArgs;
using kiln::cpu::GemmType;
using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

struct Shape {
  int64_t M, N, K;
  bool ta, tb;  // A / B given as transposed views
};

enum ShapeId {
  kSq1024,
  kFwd,
  kDW,
  kDX,
  kGemv,
  kSmall,
  kConv1,
  kConv1DW,
  kConv2,
  kConv2DW,
  kConv2DX,
  // GPT (in, out): forward, dX, dW for each layer
  kQkv,
  kQkvDX,
  kQkvDW,
  kProj,
  kProjDX,
  kProjDW,
  kUp,
  kUpDX,
  kUpDW,
  kDown,
  kDownDX,
  kDownDW,
  kHead,
  kHeadDX,
  kHeadDW,
};
constexpr Shape kShapes[] = {
    {1024, 1024, 1024, false, false},  // sq1024
    {500, 500, 784, false, false},     // fwd
    {784, 500, 500, true, false},      // dW
    {500, 784, 500, false, true},      // dX
    {1, 1024, 1024, false, false},     // gemv (batch 1)
    {64, 64, 64, false, false},        // small
    // kiln-mnist cnn, the per-image products of conv2d (columns [C*KH*KW,
    // OH*OW]): conv 1->8 on 28x28 and conv 8->16 on 14x14. (Whole-batch
    // products, e.g. 16 x 98000 x 72, measured 1.4-3.8x slower: the per-image
    // operands stay in L2.)
    {8, 784, 9, false, false},    // conv1 forward
    {8, 9, 784, false, true},     // conv1 d weight
    {16, 196, 72, false, false},  // conv2 forward
    {16, 72, 196, false, true},   // conv2 d weight
    {72, 196, 16, true, false},   // conv2 d columns
    // GPT, M = 768 tokens: forward x @ W^T, dX = dY @ W, dW = dY^T @ X
    {768, 384, 128, false, true},
    {768, 128, 384, false, false},
    {384, 128, 768, true, false},  // qkv
    {768, 128, 128, false, true},
    {768, 128, 128, false, false},
    {128, 128, 768, true, false},  // proj
    {768, 512, 128, false, true},
    {768, 128, 512, false, false},
    {512, 128, 768, true, false},  // up
    {768, 128, 512, false, true},
    {768, 512, 128, false, false},
    {128, 512, 768, true, false},  // down
    {768, 256, 128, false, true},
    {768, 128, 256, false, false},
    {256, 128, 768, true, false},  // head
};

ThreadPool& pool(int n) {
  static std::unique_ptr<ThreadPool> p[3];
  if (!p[n]) p[n] = std::make_unique<ThreadPool>(n);
  return *p[n];
}

struct Data {
  std::vector<float> a, b, c;
  std::vector<uint16_t> bf16, f16;  // B as bf16 / f16 (truncated; fine for timing)
  explicit Data(const Shape& s)
      : a(s.M * s.K), b(s.K * s.N), c(s.M * s.N), bf16(b.size()), f16(b.size()) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto& x : a) x = u(rng);
    for (auto& x : b) x = u(rng);
    for (size_t i = 0; i < b.size(); ++i) {
      uint32_t bits;
      std::memcpy(&bits, &b[i], 4);
      bf16[i] = uint16_t(bits >> 16);
      const int e = int((bits >> 23) & 0xff) - 127 + 15;  // |b| <= 1: no overflow
      f16[i] = uint16_t(((bits >> 16) & 0x8000u) |
                        (e > 0 ? uint32_t(e) << 10 | ((bits >> 13) & 0x3ffu) : 0u));
    }
  }
};

void set_counters(benchmark::State& st, const Shape& s) {
  st.counters["GFLOPS"] = benchmark::Counter(2e-9 * double(s.M) * double(s.N) * double(s.K),
                                             benchmark::Counter::kIsIterationInvariantRate);
}

// Storage: A is M x K row-major, or (ta) the K x M row-major matrix it is the
// transpose of; likewise B.
void BM_kiln(benchmark::State& st, ShapeId id, GemmType tb) {
  const Shape s = kShapes[id];
  const int threads = int(st.range(0));
  Data d(s);
  GemmArgs args{s.M, s.N, s.K, {}, {}, d.c.data(), s.N};
  args.A = {d.a.data(), GemmType::f32, s.ta ? 1 : s.K, s.ta ? s.M : 1};
  const void* bp = tb == GemmType::f32    ? static_cast<const void*>(d.b.data())
                   : tb == GemmType::bf16 ? static_cast<const void*>(d.bf16.data())
                                          : static_cast<const void*>(d.f16.data());
  args.B = {bp, tb, s.tb ? 1 : s.N, s.tb ? s.K : 1};
  ThreadPool& p = pool(threads);
  auto fn = [&](ThreadCtx& t) { kiln::cpu::gemm(args, t); };
#if defined(KILN_BENCH_HAVE_BLAS)
  // OpenBLAS's idle workers keep spinning (sched_yield) for ~2^28 cycles after
  // each call; let them go to sleep so they do not compete with kiln's threads.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
#endif
  for (auto _ : st) {
    p.run(fn);
    benchmark::DoNotOptimize(d.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, s);
  st.SetLabel(kiln::cpu::gemm_detail::kIsa);
}

#if defined(KILN_BENCH_HAVE_BLAS)
void BM_openblas(benchmark::State& st, ShapeId id) {
  const Shape s = kShapes[id];
  const int threads = int(st.range(0));
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
  Data d(s);
  const int lda = int(s.ta ? s.M : s.K), ldb = int(s.tb ? s.K : s.N);
  for (auto _ : st) {
    cblas_sgemm(CblasRowMajor, s.ta ? CblasTrans : CblasNoTrans, s.tb ? CblasTrans : CblasNoTrans,
                int(s.M), int(s.N), int(s.K), 1.0f, d.a.data(), lda, d.b.data(), ldb, 0.0f,
                d.c.data(), int(s.N));
    benchmark::DoNotOptimize(d.c.data());
    benchmark::ClobberMemory();
  }
  set_counters(st, s);
}
#endif

#define KILN_GEMM_BENCH(name, id) \
  BENCHMARK_CAPTURE(BM_kiln, name, id, GemmType::f32)->Arg(2)->Arg(1)->UseRealTime();
#define KILN_BLAS_BENCH(name, id) \
  BENCHMARK_CAPTURE(BM_openblas, name, id)->Arg(2)->Arg(1)->UseRealTime();

KILN_GEMM_BENCH(sq1024, kSq1024)
KILN_GEMM_BENCH(fwd_500x784x500, kFwd)
KILN_GEMM_BENCH(dW_784x500x500_At, kDW)
KILN_GEMM_BENCH(dX_500x500x784_Bt, kDX)
KILN_GEMM_BENCH(gemv_1x1024x1024, kGemv)
BENCHMARK_CAPTURE(BM_kiln, conv1_8x784x9, kConv1, GemmType::f32)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_kiln, conv1_dW_8x9x784_Bt, kConv1DW, GemmType::f32)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_kiln, conv2_16x196x72, kConv2, GemmType::f32)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_kiln, conv2_dW_16x72x196_Bt, kConv2DW, GemmType::f32)->Arg(1)->UseRealTime();
BENCHMARK_CAPTURE(BM_kiln, conv2_dX_72x196x16_At, kConv2DX, GemmType::f32)->Arg(1)->UseRealTime();
KILN_GEMM_BENCH(small_64, kSmall)
BENCHMARK_CAPTURE(BM_kiln, fwd_500x784x500_Bbf16, kFwd, GemmType::bf16)->Arg(2)->UseRealTime();
BENCHMARK_CAPTURE(BM_kiln, fwd_500x784x500_Bf16, kFwd, GemmType::f16)->Arg(2)->UseRealTime();
#define KILN_GPT_BENCH(name, id) \
  BENCHMARK_CAPTURE(BM_kiln, name, id, GemmType::f32)->Arg(2)->UseRealTime();
#define KILN_GPT_BLAS_BENCH(name, id) \
  BENCHMARK_CAPTURE(BM_openblas, name, id)->Arg(2)->UseRealTime();
#if defined(KILN_BENCH_HAVE_BLAS)
#define KILN_GPT(name, id) KILN_GPT_BENCH(name, id) KILN_GPT_BLAS_BENCH(name, id)
#else
#define KILN_GPT(name, id) KILN_GPT_BENCH(name, id)
#endif
KILN_GPT(gpt_qkv_768x128x384_Bt, kQkv)
KILN_GPT(gpt_qkv_dX_768x384x128, kQkvDX)
KILN_GPT(gpt_qkv_dW_384x768x128_At, kQkvDW)
KILN_GPT(gpt_proj_768x128x128_Bt, kProj)
KILN_GPT(gpt_proj_dX_768x128x128, kProjDX)
KILN_GPT(gpt_proj_dW_128x768x128_At, kProjDW)
KILN_GPT(gpt_up_768x128x512_Bt, kUp)
KILN_GPT(gpt_up_dX_768x512x128, kUpDX)
KILN_GPT(gpt_up_dW_512x768x128_At, kUpDW)
KILN_GPT(gpt_down_768x512x128_Bt, kDown)
KILN_GPT(gpt_down_dX_768x128x512, kDownDX)
KILN_GPT(gpt_down_dW_128x768x512_At, kDownDW)
KILN_GPT(gpt_head_768x128x256_Bt, kHead)
KILN_GPT(gpt_head_dX_768x256x128, kHeadDX)
KILN_GPT(gpt_head_dW_256x768x128_At, kHeadDW)

#if defined(KILN_BENCH_HAVE_BLAS)
KILN_BLAS_BENCH(sq1024, kSq1024)
KILN_BLAS_BENCH(fwd_500x784x500, kFwd)
KILN_BLAS_BENCH(dW_784x500x500_At, kDW)
KILN_BLAS_BENCH(dX_500x500x784_Bt, kDX)
KILN_BLAS_BENCH(gemv_1x1024x1024, kGemv)
KILN_BLAS_BENCH(small_64, kSmall)
#endif

}  // namespace

BENCHMARK_MAIN();
