// Fused attention (ATTENTION + ATTENTION_BACK) vs the composite it replaces
// (matmul, causal softmax, matmul and their backward rules): one forward +
// backward step on the CPU backend at 2 threads, and the bytes the graph
// allocator plans for that step (counter planned_MiB). Heads H = 4, E = 32 (the
// GPT example's n_embd 128), causal, B*T = 768 tokens per step:
//   B=12 T=64 (the default model), B=3 T=256, B=1 T=768.
//
// gpt/{f32,bf16}/{fwd,fwd_bwd}: the fused op alone at the default model's shape
// (B=12, H=4, T=64, E=32, causal), f32 or bf16 q, k, v (the bf16 policy's
// casts are outside the timed graph), forward or forward + ATTENTION_BACK;
// the argument is the thread count (1: CPU time is the work even on a busy
// machine).
// llama/{f32,bf16}/fwd: a SmolLM2 prefill layer's attention (9 heads against 3
// KV heads broadcast, T=512, E=64), the long-sequence kernels' shape.
// dropout/{fused,composite}/T: one GPT attention layer's forward + backward in
// training with dropout 0.2 on the weights (H = 4, E = 32, causal, B*T = 768,
// a per-step seed tensor), fused (AttentionOptions::dropout) against the
// composite matmul -> softmax -> dropout -> matmul (the same mask), on one
// thread (CPU time is the work even on a busy machine).
//
//   bench_attention --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/ext/op_params.h"
#include "kiln/kiln.h"

namespace {

using namespace kiln;

// One layer's training step: forward and backward of sum(out * r), with q, k,
// v (and r) uniform in [-1, 1) and the dropout step input (when given) at 1, on
// `threads` threads; counters planned_MiB and tokens_per_s.
void time_layer_step(benchmark::State& st, Context& ctx, Tensor out, std::vector<Tensor> inputs,
                     Tensor step, int threads, int64_t tokens) {
  Tensor r = ctx.input(f32, out.shape(), "r");
  Tensor loss = sum(out * r);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(threads);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  inputs.push_back(r);
  for (Tensor t : inputs) {
    std::vector<float> x(size_t(t.numel()));
    for (float& e : x) e = u(rng);
    t.set<float>(x);
  }
  if (step.defined()) step.set(std::vector<int32_t>{1});
  g.reset_grads();
  for (auto _ : st) cpu.compute(g);
  st.counters["planned_MiB"] = double(galloc.plan().buffer_size) / (1 << 20);
  st.counters["tokens_per_s"] =
      benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_attention(benchmark::State& st, bool fused) {
  const int64_t T = st.range(0), B = 768 / T, H = 4, E = 32;
  Context ctx;
  Tensor q = ctx.param(f32, {B, H, T, E}, "q"), k = ctx.param(f32, {B, H, T, E}, "k"),
         v = ctx.param(f32, {B, H, T, E}, "v");
  Tensor out =
      fused ? attention(q, k, v, {0.0f, true})
            : matmul(softmax(matmul(q, k.T()), {.scale = 0.17677669f, .mask = {}, .causal = true}),
                     v);
  time_layer_step(st, ctx, out, {q, k, v}, Tensor(), 2, B * T);
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

// The ATTENTION (and with `backward` ATTENTION_BACK) node alone on inputs of
// `dt`: q [B * Hkv, G, T, E] against k, v [B * Hkv, 1 -> G, T, E].
void run_attention(benchmark::State& st, DType dt, bool backward, int64_t B, int64_t Hkv, int64_t G,
                   int64_t T, int64_t E) {
  Context ctx;
  const Shape s{B * Hkv, G, T, E};
  Tensor q = ctx.input(dt, s, "q"), k = ctx.input(dt, {B * Hkv, 1, T, E}, "k"),
         v = ctx.input(dt, {B * Hkv, 1, T, E}, "v");
  Tensor o = attention(q, k.expand(s), v.expand(s), {0.0f, true});
  Tensor dout = ctx.input(dt, s, "dout"), out = o;
  if (backward) {
    const AttentionParams p{1.0f / std::sqrt(float(E)), true};
    out = detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{3 * q.numel()},
                          {q, k.expand(s), v.expand(s), o, dout}, p);
  }
  Graph g = Graph::forward(out);
  CpuBackend cpu(int(st.range(0)));
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  for (Tensor t : {q, k, v, dout}) {
    if (!t.has_data()) continue;  // dout without backward
    std::vector<float> x(size_t(t.numel()));
    for (float& e : x) e = u(rng);
    if (dt == f32) {
      t.set<float>(x);
      continue;
    }
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) h[i] = uint16_t(std::bit_cast<uint32_t>(x[i]) >> 16);
    t.set<uint16_t>(h);
  }
  for (auto _ : st) cpu.compute(g);
  st.counters["tokens_per_s"] =
      benchmark::Counter(double(B * T), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_gpt(benchmark::State& st, DType dt, bool backward) {
  run_attention(st, dt, backward, 12, 4, 1, 64, 32);
}
void BM_llama(benchmark::State& st, DType dt) { run_attention(st, dt, false, 1, 3, 3, 512, 64); }

BENCHMARK_CAPTURE(BM_gpt, f32_fwd, f32, false)
    ->Name("gpt/f32/fwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_gpt, f32_fwd_bwd, f32, true)
    ->Name("gpt/f32/fwd_bwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_gpt, bf16_fwd, bf16, false)
    ->Name("gpt/bf16/fwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_gpt, bf16_fwd_bwd, bf16, true)
    ->Name("gpt/bf16/fwd_bwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_llama, f32_fwd, f32)
    ->Name("llama/f32/fwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_llama, bf16_fwd, bf16)
    ->Name("llama/bf16/fwd")
    ->Arg(1)
    ->Arg(2)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

// One GPT layer's attention with dropout 0.2, forward + backward (see the top).
void BM_dropout(benchmark::State& st, bool fused) {
  const int64_t T = st.range(0), B = 768 / T, H = 4, E = 32;
  const float p = 0.2f, scale = 1.0f / std::sqrt(float(E));
  const uint64_t seed = 77;
  Context ctx;
  Tensor q = ctx.param(f32, {B, H, T, E}, "q"), k = ctx.param(f32, {B, H, T, E}, "k"),
         v = ctx.param(f32, {B, H, T, E}, "v");
  Tensor step = ctx.input(i32, {1}, "step");
  AttentionOptions o{scale, true};
  o.dropout = p;
  o.seed = seed;
  o.seed_tensor = step;
  SoftmaxOptions so;
  so.scale = scale;
  so.causal = true;
  Tensor out = fused ? attention(q, k, v, o)
                     : matmul(dropout(softmax(matmul(q, k.T()), so), p, seed, true, step), v);
  time_layer_step(st, ctx, out, {q, k, v}, step, 1, B * T);
}

BENCHMARK_CAPTURE(BM_dropout, fused, true)
    ->Name("dropout/fused")
    ->Arg(64)
    ->Arg(256)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_dropout, composite, false)
    ->Name("dropout/composite")
    ->Arg(64)
    ->Arg(256)
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
