// Elementwise / reduction kernel throughput against a memory-bandwidth baseline,
// and the per-node overhead of running a graph.
//
// BM_op/<op>/<threads>: one kiln graph node over 16M-element f32 tensors
// (64 MiB each), allocated with kiln::allocate_tensors and run with
// CpuBackend::compute. Counter GB/s = (bytes read + bytes written) per run /
// time, 1 GB = 1e9 bytes; add/mul move 3 x 64 MiB, relu/exp/gelu 2 x 64 MiB, sum
// 64 MiB.
// BM_triad/<threads>: STREAM-like triad a[i] = b[i] + s*c[i] over three 64 MiB
// arrays on a cpu::ThreadPool, contiguous chunks, plain stores, counted like
// STREAM (3 x 64 MiB; the write-allocate read of `a` is not counted, exactly as
// for the kernels). The kernel/triad ratio at 2 threads is the figure of merit.
// BM_graph_overhead: 10k chained adds of [4]-element tensors in one graph;
// counter ns_per_node = time per run / 10k.
// BM_gpt_node/<op>: kiln-gpt's per-layer norm and activation (layer_norm with
// weight and bias over [768, 128], gelu erf or tanh over [768, 512]; ops 3 and
// 4: gelu reading a bf16 x, as under the bf16 policy, through a cast timed as
// its own node) forward and backward, 2 threads (KILN_BENCH_THREADS sets others), node by node:
// counter <op name> = microseconds per run of that node (the minimum over the runs: the machine is
// shared).
//
//   bench_elementwise --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
// (aggregates: mean, median, stddev, cv, and min / max of every value).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cpu/thread_pool.h"
#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"
#include "kiln/ops.h"

namespace {

constexpr int64_t kN = int64_t(16) << 20;  // 16M floats = 64 MiB

// Wall time of the timed loop, measured here so the counters are plain numbers
// (a rate counter would print "GB/s=12/s").
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

enum class Which { add, mul, relu, exp, gelu, sum };
const char* const kNames[] = {"add", "mul", "relu", "exp", "gelu", "sum"};

// One graph per (op, threads), built and filled once.
struct OpGraph {
  kiln::Context ctx;
  kiln::CpuBackend backend;
  kiln::Graph graph;
  std::unique_ptr<kiln::Buffer> buf;
  double bytes = 0;

  OpGraph(Which w, int threads) : backend(threads) {
    kiln::Tensor x = ctx.input(kiln::f32, {kN}, "x");
    kiln::Tensor y = ctx.input(kiln::f32, {kN}, "y");
    kiln::Tensor out;
    const double mb = double(kN) * 4;
    switch (w) {
      case Which::add: out = kiln::add(x, y), bytes = 3 * mb; break;
      case Which::mul: out = kiln::mul(x, y), bytes = 3 * mb; break;
      case Which::relu: out = kiln::relu(x), bytes = 2 * mb; break;
      case Which::exp: out = kiln::exp(x), bytes = 2 * mb; break;
      case Which::gelu: out = kiln::gelu(x), bytes = 2 * mb; break;
      case Which::sum: out = kiln::sum(x), bytes = mb; break;
    }
    graph = kiln::Graph::forward(out);
    buf = kiln::allocate_tensors(ctx, backend);
    std::vector<float> v(static_cast<size_t>(kN));
    for (int64_t i = 0; i < kN; ++i) v[size_t(i)] = float(i % 1000) * 0.004f - 2.0f;
    x.set(v);
    y.set(v);
    backend.compute(graph);  // first touch of the output
  }
};

void BM_op(benchmark::State& state) {
  const Which w = Which(state.range(0));
  const int threads = int(state.range(1));
  static std::unique_ptr<OpGraph> g;
  g.reset();  // one 64 MiB graph alive at a time
  g = std::make_unique<OpGraph>(w, threads);
  state.SetLabel(kNames[state.range(0)]);
  const auto t0 = Clock::now();
  for (auto _ : state) g->backend.compute(g->graph);
  state.counters["GB/s"] = g->bytes * double(state.iterations()) * 1e-9 / seconds_since(t0);
  g.reset();
}

void op_args(benchmark::internal::Benchmark* b) {
  for (int w = 0; w < 6; ++w)
    for (int t : {1, 2}) b->Args({w, t});
}
// With --benchmark_repetitions, "best" reports the fastest run's time and the
// highest GB/s (min and max of each value): on a shared machine the best run is
// the closest to what the hardware can do.
double stat_min(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }
double stat_max(const std::vector<double>& v) { return *std::max_element(v.begin(), v.end()); }
void with_stats(benchmark::internal::Benchmark* b) {
  b->ComputeStatistics("min", stat_min)->ComputeStatistics("max", stat_max)->UseRealTime();
}

BENCHMARK(BM_op)
    ->Apply(op_args)
    ->Apply(with_stats)
    ->ArgNames({"op", "threads"})
    ->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------- triad
struct TriadArrays {
  float *a, *b, *c;
  TriadArrays(kiln::cpu::ThreadPool& pool) {
    a = static_cast<float*>(std::aligned_alloc(4096, kN * 4));
    b = static_cast<float*>(std::aligned_alloc(4096, kN * 4));
    c = static_cast<float*>(std::aligned_alloc(4096, kN * 4));
    pool.run([&](kiln::cpu::ThreadCtx& t) {  // first touch by the using thread
      for (int64_t i = kN * t.ith / t.nth; i < kN * (t.ith + 1) / t.nth; ++i)
        a[i] = 0, b[i] = 1, c[i] = 2;
    });
  }
  ~TriadArrays() { std::free(a), std::free(b), std::free(c); }
};

void triad(float* __restrict a, const float* __restrict b, const float* __restrict c, float s,
           int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) a[i] = b[i] + s * c[i];
}

void BM_triad(benchmark::State& state) {
  kiln::cpu::ThreadPool pool(int(state.range(0)));
  TriadArrays arr(pool);
  const auto t0 = Clock::now();
  for (auto _ : state) {
    pool.run([&](kiln::cpu::ThreadCtx& t) {
      const int64_t i0 = kN / 16 * t.ith / t.nth * 16, i1 = kN / 16 * (t.ith + 1) / t.nth * 16;
      triad(arr.a, arr.b, arr.c, 3.0f, i0, i1);
    });
    benchmark::DoNotOptimize(arr.a);
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = 3.0 * kN * 4 * double(state.iterations()) * 1e-9 / seconds_since(t0);
}
BENCHMARK(BM_triad)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->Apply(with_stats)
    ->Unit(benchmark::kMillisecond);

// ---------------------------------------------------------------- overhead
void BM_graph_overhead(benchmark::State& state) {
  constexpr int kNodes = 10000;
  kiln::Context ctx;
  kiln::CpuBackend backend(int(state.range(0)));
  kiln::Tensor x = ctx.input(kiln::f32, {4}, "x");
  kiln::Tensor y = x;
  for (int i = 0; i < kNodes; ++i) y = kiln::add(y, x);
  kiln::Graph g = kiln::Graph::forward(y);
  auto buf = kiln::allocate_tensors(ctx, backend);
  x.set(std::vector<float>{1, 2, 3, 4});
  const auto t0 = Clock::now();
  for (auto _ : state) backend.compute(g);
  state.counters["ns_per_node"] = seconds_since(t0) * 1e9 / (double(state.iterations()) * kNodes);
}
BENCHMARK(BM_graph_overhead)
    ->Arg(1)
    ->Arg(2)
    ->ArgName("threads")
    ->Apply(with_stats)
    ->Unit(benchmark::kMicrosecond);

// ---------------------------------------------------------------- gpt nodes
enum class GptOp { layer_norm, gelu_erf, gelu_tanh, gelu_erf_bf16_x, gelu_tanh_bf16_x };
const char* const kGptNames[] = {"layer_norm", "gelu_erf", "gelu_tanh", "gelu_erf_bf16_x",
                                 "gelu_tanh_bf16_x"};

void BM_gpt_node(benchmark::State& state) {
  const GptOp w = GptOp(state.range(0));
  kiln::Context ctx;
  const char* threads = std::getenv("KILN_BENCH_THREADS");
  kiln::CpuBackend backend(threads && *threads ? std::atoi(threads) : 2);
  const int64_t d = w == GptOp::layer_norm ? 128 : 512;
  kiln::Tensor x = ctx.param(kiln::f32, {768, d}, "x");
  kiln::Tensor r = ctx.input(kiln::f32, {768, d}, "r");
  kiln::Tensor y;
  kiln::Tensor wt, bs;
  if (w == GptOp::layer_norm) {
    wt = ctx.param(kiln::f32, {d}, "w");
    bs = ctx.param(kiln::f32, {d}, "b");
    y = kiln::layer_norm(x, wt, bs);
  } else {
    const bool erf = w == GptOp::gelu_erf || w == GptOp::gelu_erf_bf16_x;
    const bool x16 = w == GptOp::gelu_erf_bf16_x || w == GptOp::gelu_tanh_bf16_x;
    y = kiln::gelu(x16 ? x.to(kiln::bf16) : x,
                   erf ? kiln::GeluApprox::none : kiln::GeluApprox::tanh);
  }
  const kiln::Tensor loss = kiln::sum(y * r);
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  auto buf = kiln::allocate_tensors(ctx, backend);
  std::vector<float> v(size_t(768 * d));
  for (size_t i = 0; i < v.size(); ++i) v[i] = float(i % 1000) * 0.004f - 2.0f;
  x.set(v);
  r.set(v);
  if (wt.defined()) {
    wt.set(std::vector<float>(size_t(d), 1.5f));
    bs.set(std::vector<float>(size_t(d), 0.25f));
  }
  std::map<std::string, double> best;  // op name -> fastest run, microseconds
  const auto& nodes = g.nodes();
  for (auto _ : state) {
    for (size_t i = 0; i < nodes.size(); ++i) {
      const auto t0 = Clock::now();
      backend.compute(std::span<kiln::TensorNode* const>(&nodes[i], 1));
      const double us = seconds_since(t0) * 1e6;
      const std::string key = std::string(i < g.n_forward() ? "f." : "b.") +
                              kiln::op_name(nodes[i]->op) + "#" + std::to_string(i);
      auto [it, fresh] = best.try_emplace(key, us);
      if (!fresh) it->second = std::min(it->second, us);
    }
  }
  state.SetLabel(kGptNames[state.range(0)]);
  for (auto& [k, us] : best) state.counters[k] = us;
}
BENCHMARK(BM_gpt_node)->DenseRange(0, 4)->ArgName("op")->UseRealTime()->Iterations(200);

}  // namespace

BENCHMARK_MAIN();
