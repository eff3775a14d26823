// Memory-bandwidth baseline and thread-pool overheads.
//
// BM_triad: STREAM-like triad a[i] = b[i] + s*c[i] over three 64 MiB f32 arrays,
// split over the ThreadPool's threads in contiguous chunks. Counter GB/s uses
// the STREAM accounting: 3 arrays x 64 MiB per iteration (read b, read c,
// write a), 1 GB = 1e9 bytes. The write-allocate read of `a` that plain stores
// cause is NOT counted (as in STREAM), so plain-store triad under-reports the
// bus traffic by 4/3; the _nt variant uses non-temporal stores, which avoid it.
// Elementwise ops are compared against BM_triad/plain at 2 threads.
//
// BM_pool_*: ThreadPool overheads at 2 threads: an empty run(), one barrier,
// and a "graph" of 10k tiny nodes (run() once, a barrier after each node) whose
// counter ns_per_node is the per-node overhead.
//
//   bench_stream --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>

#include "backends/cpu/thread_pool.h"

#if defined(__AVX512F__) || defined(__AVX__) || defined(__SSE2__)
#include <immintrin.h>
#endif

namespace {

using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

ThreadPool& pool(int n) {
  static std::unique_ptr<ThreadPool> p[3];
  if (!p[n]) p[n] = std::make_unique<ThreadPool>(n);
  return *p[n];
}

constexpr int64_t kBytes = int64_t(64) << 20;
constexpr int64_t kN = kBytes / int64_t(sizeof(float));

struct Arrays {
  float *a, *b, *c;
  Arrays() {
    a = static_cast<float*>(std::aligned_alloc(4096, kBytes));
    b = static_cast<float*>(std::aligned_alloc(4096, kBytes));
    c = static_cast<float*>(std::aligned_alloc(4096, kBytes));
    // First touch by the threads that will use each chunk.
    pool(2).run([&](ThreadCtx& t) {
      const int64_t i0 = kN * t.ith / t.nth, i1 = kN * (t.ith + 1) / t.nth;
      for (int64_t i = i0; i < i1; ++i) a[i] = 0.0f, b[i] = 1.0f, c[i] = 2.0f;
    });
  }
  ~Arrays() { std::free(a), std::free(b), std::free(c); }
};

Arrays& arrays() {
  static Arrays arr;
  return arr;
}

// Chunk boundaries on 64-byte multiples.
void chunk(const ThreadCtx& t, int64_t& i0, int64_t& i1) {
  i0 = kN / 16 * t.ith / t.nth * 16;
  i1 = t.ith + 1 == t.nth ? kN : kN / 16 * (t.ith + 1) / t.nth * 16;
}

void triad_plain(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
                 int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) a[i] = b[i] + s * c[i];
}

void triad_nt(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
              int64_t i0, int64_t i1) {
#if defined(__AVX512F__)
  const __m512 vs = _mm512_set1_ps(s);
  for (int64_t i = i0; i < i1; i += 16)
    _mm512_stream_ps(a + i, _mm512_fmadd_ps(vs, _mm512_load_ps(c + i), _mm512_load_ps(b + i)));
  _mm_sfence();
#elif defined(__SSE2__)
  const __m128 vs = _mm_set1_ps(s);
  for (int64_t i = i0; i < i1; i += 4)
    _mm_stream_ps(a + i, _mm_add_ps(_mm_load_ps(b + i), _mm_mul_ps(vs, _mm_load_ps(c + i))));
  _mm_sfence();
#else
  triad_plain(a, b, c, s, i0, i1);
#endif
}

template <bool kNT>
void BM_triad(benchmark::State& st) {
  Arrays& arr = arrays();
  ThreadPool& p = pool(int(st.range(0)));
  const float s = 3.0f;
  auto fn = [&](ThreadCtx& t) {
    int64_t i0, i1;
    chunk(t, i0, i1);
    if (kNT) triad_nt(arr.a, arr.b, arr.c, s, i0, i1);
    else triad_plain(arr.a, arr.b, arr.c, s, i0, i1);
  };
  for (auto _ : st) {
    p.run(fn);
    benchmark::ClobberMemory();
  }
  st.counters["GB/s"] = benchmark::Counter(3.0 * double(kBytes) * 1e-9,
                                           benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_triad<false>)->Name("BM_triad/plain")->Arg(2)->Arg(1)->UseRealTime();
BENCHMARK(BM_triad<true>)->Name("BM_triad/nt")->Arg(2)->Arg(1)->UseRealTime();

// Empty run(): the cost of waking the (spinning) workers and joining them.
void BM_pool_run_empty(benchmark::State& st) {
  ThreadPool& p = pool(2);
  auto fn = [](ThreadCtx&) {};
  for (auto _ : st) p.run(fn);
}
BENCHMARK(BM_pool_run_empty)->UseRealTime();

// run() after the workers went to sleep (5 ms idle): the futex wake-up path.
void BM_pool_run_after_idle(benchmark::State& st) {
  ThreadPool& p = pool(2);
  auto fn = [](ThreadCtx&) {};
  for (auto _ : st) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto t0 = std::chrono::steady_clock::now();
    p.run(fn);
    st.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
}
BENCHMARK(BM_pool_run_after_idle)->UseManualTime()->Iterations(200);

// One barrier of 2 threads (10k barriers per run()).
void BM_pool_barrier(benchmark::State& st) {
  ThreadPool& p = pool(2);
  constexpr int kBarriers = 10000;
  auto fn = [](ThreadCtx& t) {
    for (int i = 0; i < kBarriers; ++i) t.barrier();
  };
  for (auto _ : st) p.run(fn);
  st.counters["ns_per_barrier"] =
      benchmark::Counter(double(kBarriers) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                       benchmark::Counter::kInvert);
}
BENCHMARK(BM_pool_barrier)->UseRealTime();

// A graph of 10k tiny nodes: run() once, each node does a few adds on each
// thread's share of a 64-float vector, then a barrier.
void BM_pool_graph10k(benchmark::State& st) {
  ThreadPool& p = pool(2);
  constexpr int kNodes = 10000;
  alignas(64) static float buf[2][64];
  auto fn = [](ThreadCtx& t) {
    float* x = buf[t.ith];
    for (int node = 0; node < kNodes; ++node) {
      for (int i = 0; i < 64; ++i) x[i] = x[i] * 0.5f + 1.0f;
      t.barrier();
    }
  };
  for (auto _ : st) {
    p.run(fn);
    benchmark::ClobberMemory();
  }
  st.counters["ns_per_node"] =
      benchmark::Counter(double(kNodes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                    benchmark::Counter::kInvert);
}
BENCHMARK(BM_pool_graph10k)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
