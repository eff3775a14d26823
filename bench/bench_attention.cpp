// Fused attention (ATTENTION + ATTENTION_BACK) vs the composite it replaces
// (matmul, causal softmax, matmul and their backward rules): one forward +
// backward step on the CPU backend at 2 threads, and the bytes the graph
// allocator plans for that step (counter planned_MiB). Heads H = 4, E = 32 (the
// GPT example's n_embd 128), causal, B*T = 768 tokens per step:
//   B=12 T=64 (the default model), B=3 T=256, B=1 T=768.
//
//   bench_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <random>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;

void BM_attention(benchmark::State& st, bool fused) {
  const int64_t T = st.range(0), B = 768 / T, H = 4, E = 32;
  Context ctx;
  Tensor q = ctx.param(f32, {B, H, T, E}, "q"), k = ctx.param(f32, {B, H, T, E}, "k"),
         v = ctx.param(f32, {B, H, T, E}, "v");
  Tensor out =
      fused ? attention(q, k, v, {0.0f, true})
            : matmul(softmax(matmul(q, k.T()), {.scale = 0.17677669f, .mask = {}, .causal = true}),
                     v);
  Tensor r = ctx.input(f32, out.shape(), "r");
  Tensor loss = sum(out * r);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(2);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (Tensor t : {q, k, v, r}) {
    std::vector<float> x(size_t(t.numel()));
    for (float& e : x) e = u(rng);
    t.set<float>(x);
  }
  g.reset_grads();
  for (auto _ : st) cpu.compute(g);
  st.counters["planned_MiB"] = double(galloc.plan().buffer_size) / (1 << 20);
  st.counters["tokens_per_s"] =
      benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
}

BENCHMARK_CAPTURE(BM_attention, fused, true)
    ->Arg(64)
    ->Arg(256)
    ->Arg(768)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_attention, composite, false)
    ->Arg(64)
    ->Arg(256)
    ->Arg(768)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
