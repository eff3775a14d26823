// Quantized-weight matrix products (kiln::cpu::qmatmul_xwt / qmatmul_xw) against
// their f32 counterparts on SmolLM2-135M's shapes (Q8_0, Q4_0; decode also
// Q4_1, Q5_0, Q5_1) and on its
// 768-wide variant (k256_*: Q4_K, Q5_K, Q6_K and Q8_0, rows of whole 256-value
// blocks), both timed in the same iteration so the ratio holds on a noisy
// machine:
//   BM_decode: one token's x @ W^T (m = 1) over all 30 layers' matrices and the
//     head (538 MB in f32, 143 MB in Q8_0, 76 MB in Q4_0: memory-bound), the f32
//     one by cpu::gemv_rows. Counters: GB/s of weights read by each, and
//     x_f32 = f32 time / quantized time (tokens/s ratio of the matmuls).
//   BM_prefill / BM_backward: m = 512 rows through one matrix (x @ W^T, and
//     dy @ W), against cpu::gemm on the f32 matrix. Counters: GFLOPS, x_f32.
// Arg: threads. Iteration time is the quantized product's (manual time).
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/qmatmul.h"
#include "backends/cpu/thread_pool.h"
#include "llama_shape.h"

using kiln::DType;
using kiln::cpu::GemmType;
using kiln::cpu::QuantMatrix;
using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

namespace {

ThreadPool& pool(int n) {
  static std::unique_ptr<ThreadPool> p[3];
  if (!p[n]) p[n] = std::make_unique<ThreadPool>(n);
  return *p[n];
}

struct Shape {
  int64_t n, k;  // W is [n, k]
};

// Every layer's weights (q, k, v, o, gate, up, down) and the tied head of
// SmolLM2-135M's shape, or (k256) of its 768-wide variant whose rows are whole
// blocks of 256 (llama_shape.h), for the k-quants.
std::vector<Shape> model_shapes(bool k256 = false) {
  const kiln::models::LlamaConfig c =
      *(k256 ? bench::smollm2_k256_shape() : bench::smollm2_135m_shape()).llama;
  const int64_t h = c.hidden_size, kv = c.num_key_value_heads * c.head_dim, f = c.intermediate_size;
  std::vector<Shape> s;
  for (int64_t l = 0; l < c.num_hidden_layers; ++l)
    for (Shape w : {Shape{h, h}, Shape{kv, h}, Shape{kv, h}, Shape{h, h}, Shape{f, h}, Shape{f, h},
                    Shape{h, f}})
      s.push_back(w);
  s.push_back({c.vocab_size, h});  // tied head
  return s;
}

uint32_t next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return uint32_t(s >> 33);
}

// Random values in [-1, 1) (timing only).
std::vector<float> random_f32(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (auto& x : v) x = float(int32_t(next(seed))) * 0x1p-31f;
  return v;
}

// Byte offsets of the f16 scales in a block of f (Q8_0/Q4_0: d; the
// k-quants: d and, with mins, dmin; the others: d and m).
std::vector<size_t> scale_offsets(DType f) {
  switch (f) {
    case DType::q2_k: return {80, 82};
    case DType::q3_k: return {108};
    case DType::q4_k:
    case DType::q5_k: return {0, 2};
    case DType::q6_k: return {208};
    case DType::q4_1:
    case DType::q5_1: return {0, 2};
    default: return {0};
  }
}

// A quantized [n, k] matrix of random quants with in-range f16 scales (timing only).
std::vector<uint8_t> random_quant(DType f, Shape s, uint64_t seed) {
  const size_t rb = kiln::cpu::quant_row_bytes(f, s.k), bs = kiln::dtype_size(f);
  std::vector<uint8_t> v(rb * size_t(s.n));
  for (auto& b : v) b = uint8_t(next(seed));
  for (size_t o = 0; o < v.size(); o += bs)
    for (size_t at : scale_offsets(f)) {
      const uint16_t d = uint16_t(0x2000 | (next(seed) & 0x3ff));  // ~2^-7
      std::memcpy(&v[o + at], &d, 2);
    }
  return v;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_decode(benchmark::State& st, DType f, bool k256) {
  const int threads = int(st.range(0));
  const std::vector<Shape> shapes = model_shapes(k256);
  std::vector<std::vector<float>> w32;
  std::vector<std::vector<uint8_t>> wq;
  double bytes32 = 0, bytesq = 0;
  int64_t max_n = 0, max_k = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    w32.push_back(random_f32(size_t(shapes[i].n * shapes[i].k), i + 1));
    wq.push_back(random_quant(f, shapes[i], i + 1));
    bytes32 += double(w32.back().size()) * 4, bytesq += double(wq.back().size());
    max_n = std::max(max_n, shapes[i].n), max_k = std::max(max_k, shapes[i].k);
  }
  const std::vector<float> x = random_f32(size_t(max_k), 99);
  std::vector<float> y(static_cast<size_t>(max_n));
  ThreadPool& p = pool(threads);
  auto f32_token = [&](ThreadCtx& t) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape s = shapes[i];
      kiln::cpu::gemv_rows({w32[i].data(), GemmType::f32, s.k, 1}, x.data(), s.k, y.data(),
                           s.n * t.ith / t.nth, s.n * (t.ith + 1) / t.nth, false);
      t.barrier();
    }
  };
  auto quant_token = [&](ThreadCtx& t) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape s = shapes[i];
      const QuantMatrix W{wq[i].data(), f, s.n, s.k, kiln::cpu::quant_row_bytes(f, s.k)};
      kiln::cpu::qmatmul_xwt(W, x.data(), s.k, y.data(), s.n, 1, t);
    }
  };
  p.run(f32_token);  // warm-up
  p.run(quant_token);
  double t32 = 0, tq = 0;
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    p.run(f32_token);
    t32 += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    p.run(quant_token);
    const double s = seconds_since(t0);
    tq += s;
    st.SetIterationTime(s);
    benchmark::DoNotOptimize(y.data());
  }
  const double it = double(st.iterations());
  st.counters["GBps_q"] = bytesq * it / tq / 1e9;
  st.counters["GBps_f32"] = bytes32 * it / t32 / 1e9;
  st.counters["x_f32"] = t32 / tq;
  st.SetLabel(kiln::cpu::gemm_detail::kIsa);
}

// m = 512 rows through one [n, k] matrix: x @ W^T (backward = false) or dy @ W.
void BM_batch(benchmark::State& st, DType f, Shape s, bool backward) {
  const int threads = int(st.range(0));
  constexpr int64_t m = 512;
  const std::vector<float> w32 = random_f32(size_t(s.n * s.k), 1);
  const std::vector<uint8_t> wq = random_quant(f, s, 1);
  const QuantMatrix W{wq.data(), f, s.n, s.k, kiln::cpu::quant_row_bytes(f, s.k)};
  const int64_t in = backward ? s.n : s.k, out = backward ? s.k : s.n;
  const std::vector<float> x = random_f32(size_t(m * in), 2);
  std::vector<float> y(size_t(m * out));
  kiln::cpu::GemmArgs g{m, out, in, {x.data(), GemmType::f32, in, 1}, {}, y.data(), out};
  g.B = backward ? kiln::cpu::GemmOperand{w32.data(), GemmType::f32, s.k, 1}
                 : kiln::cpu::GemmOperand{w32.data(), GemmType::f32, 1, s.k};
  ThreadPool& p = pool(threads);
  auto f32_fn = [&](ThreadCtx& t) { kiln::cpu::gemm(g, t); };
  auto quant_fn = [&](ThreadCtx& t) {
    if (backward) kiln::cpu::qmatmul_xw(W, x.data(), in, y.data(), out, m, t);
    else kiln::cpu::qmatmul_xwt(W, x.data(), in, y.data(), out, m, t);
  };
  p.run(f32_fn);
  p.run(quant_fn);
  double t32 = 0, tq = 0;
  for (auto _ : st) {
    auto t0 = std::chrono::steady_clock::now();
    p.run(f32_fn);
    t32 += seconds_since(t0);
    t0 = std::chrono::steady_clock::now();
    p.run(quant_fn);
    const double sec = seconds_since(t0);
    tq += sec;
    st.SetIterationTime(sec);
    benchmark::DoNotOptimize(y.data());
  }
  const double it = double(st.iterations()), flop = 2.0 * double(m * s.n * s.k);
  st.counters["GFLOPS_q"] = flop * it / tq / 1e9;
  st.counters["GFLOPS_f32"] = flop * it / t32 / 1e9;
  st.counters["x_f32"] = t32 / tq;
  st.SetLabel(kiln::cpu::gemm_detail::kIsa);
}

constexpr Shape kGate{1536, 576}, kDown{576, 1536};
constexpr Shape kGate768{2048, 768}, kDown768{768, 2048};  // the k256 shape's

}  // namespace

BENCHMARK_CAPTURE(BM_decode, q8_0, DType::q8_0, false)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, q4_0, DType::q4_0, false)->Arg(1)->Arg(2)->UseManualTime();
// The 32-value blocks llama.cpp's quantizer falls back to on 576-wide rows.
BENCHMARK_CAPTURE(BM_decode, q4_1, DType::q4_1, false)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, q5_0, DType::q5_0, false)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, q5_1, DType::q5_1, false)->Arg(1)->Arg(2)->UseManualTime();
// The k-quants on the 768-wide shape (every row whole blocks of 256), Q8_0 on
// the same shape for comparison.
BENCHMARK_CAPTURE(BM_decode, k256_q8_0, DType::q8_0, true)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, k256_q4_k, DType::q4_k, true)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, k256_q5_k, DType::q5_k, true)->Arg(1)->Arg(2)->UseManualTime();
BENCHMARK_CAPTURE(BM_decode, k256_q6_k, DType::q6_k, true)->Arg(1)->Arg(2)->UseManualTime();
#define KILN_QBATCH(name, shape, backward)                                                         \
  BENCHMARK_CAPTURE(BM_batch, name##_q8_0, DType::q8_0, shape, backward)->Arg(2)->UseManualTime(); \
  BENCHMARK_CAPTURE(BM_batch, name##_q4_0, DType::q4_0, shape, backward)->Arg(2)->UseManualTime();
KILN_QBATCH(prefill_gate_512x1536x576, kGate, false)
KILN_QBATCH(prefill_down_512x576x1536, kDown, false)
KILN_QBATCH(backward_gate_512x576x1536, kGate, true)
KILN_QBATCH(backward_down_512x1536x576, kDown, true)
#define KILN_KBATCH(name, shape, backward)                                                         \
  BENCHMARK_CAPTURE(BM_batch, name##_q4_k, DType::q4_k, shape, backward)->Arg(2)->UseManualTime(); \
  BENCHMARK_CAPTURE(BM_batch, name##_q6_k, DType::q6_k, shape, backward)->Arg(2)->UseManualTime();
KILN_KBATCH(prefill_gate_512x2048x768, kGate768, false)
KILN_KBATCH(backward_down_512x2048x768, kDown768, true)

BENCHMARK_MAIN();
