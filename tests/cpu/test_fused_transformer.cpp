// The fused transformer primitives against the composites they replace:
// attention (forward and gradients vs matmul + causal softmax + matmul),
// layer_norm (gradients vs the mean/var formula), cross_entropy (vs one_hot *
// log_softmax, and PyTorch's finite loss with -inf logits); and the planned
// memory of attention, which must grow like T, not T^2.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

std::vector<float> randoms(int64_t n, uint64_t seed, float lo = -1, float hi = 1) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = a.size() == b.size() ? 0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

// Runs loss = sum(out * r) (r random, fixed) forward + backward on 2 threads and
// returns out and the gradients of `params`.
struct Outcome {
  std::vector<float> out;
  std::vector<std::vector<float>> grads;
};
Outcome run_graph(Context& ctx, Tensor out, const std::vector<Tensor>& params,
                  const std::vector<std::vector<float>>& values) {
  detail::set_flags(out, kFlagOutput);  // keep it readable after the backward pass
  Tensor r = ctx.input(f32, out.shape(), "r");
  Tensor loss = sum(out * r);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(2);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    p.set<float>(values[i]);
  }
  r.set<float>(randoms(out.numel(), 99));
  g.reset_grads();
  cpu.compute(g);
  Outcome res{out.get<float>(), {}};
  for (const Tensor& p : params) res.grads.push_back(g.grad(p).get<float>());
  return res;
}

Tensor composite_attention(Tensor q, Tensor k, Tensor v, float scale, bool causal) {
  SoftmaxOptions o;
  o.scale = scale;
  o.causal = causal;
  return matmul(softmax(matmul(q, k.T()), o), v);
}

}  // namespace

// Shapes chosen so that the kernel's query tiles (4 rows) end early, the key
// loop runs full 4-vector chunks and tails of every vector count, and E has
// full, partial and several column chunks (AVX-512: 16 lanes; AVX2: 8).
TEST(FusedAttention, MatchesTheCompositeForwardAndBackward) {
  struct Dims {
    int64_t B, H, Tq, Tk, E;
  };
  for (const Dims d : {Dims{2, 3, 37, 41, 24}, Dims{1, 2, 8, 64, 32}, Dims{1, 1, 70, 70, 50},
                       Dims{2, 1, 64, 64, 64}, Dims{1, 1, 5, 130, 7}}) {
    const auto [B, H, Tq, Tk, E] = d;
    for (const bool causal : {true, false}) {
      const std::vector<std::vector<float>> vals = {
          randoms(B * H * Tq * E, 1), randoms(B * H * Tk * E, 2), randoms(B * H * Tk * E, 3)};
      Outcome fused, comp;
      for (int which = 0; which < 2; ++which) {
        Context ctx;
        Tensor q = ctx.param(f32, {B, H, Tq, E}, "q"), k = ctx.param(f32, {B, H, Tk, E}, "k"),
               v = ctx.param(f32, {B, H, Tk, E}, "v");
        const float scale = 1.0f / std::sqrt(float(E));
        Tensor out = which == 0 ? attention(q, k, v, {0.0f, causal})
                                : composite_attention(q, k, v, scale, causal);
        (which == 0 ? fused : comp) = run_graph(ctx, out, {q, k, v}, vals);
      }
      const std::string at = "Tq " + std::to_string(Tq) + " Tk " + std::to_string(Tk) + " E " +
                             std::to_string(E) + " causal " + std::to_string(causal);
      EXPECT_LT(max_diff(fused.out, comp.out), 2e-6) << at;
      for (size_t i = 0; i < 3; ++i)
        EXPECT_LT(max_diff(fused.grads[i], comp.grads[i]), 1e-5) << "grad " << i << ", " << at;
    }
  }
}

// Planned bytes of forward + backward at T and 4T: the fused op needs memory
// linear in T (4x), the composite quadratic (its [T, T] scores: ~16x).
TEST(FusedAttention, PlannedMemoryGrowsLinearlyInT) {
  auto planned = [](int64_t T, bool fused) {
    Context ctx;
    const int64_t B = 1, H = 2, E = 16;
    Tensor q = ctx.param(f32, {B, H, T, E}, "q"), k = ctx.param(f32, {B, H, T, E}, "k"),
           v = ctx.param(f32, {B, H, T, E}, "v");
    Tensor out =
        fused ? attention(q, k, v, {0.0f, true}) : composite_attention(q, k, v, 0.25f, true);
    Tensor loss = sum(out);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    GraphAllocator galloc(host_buffer_type());
    return double(galloc.measure(g).buffer_size);
  };
  const double f1 = planned(256, true), f4 = planned(1024, true);
  const double c1 = planned(256, false), c4 = planned(1024, false);
  EXPECT_LT(f4 / f1, 4.5) << f1 << " -> " << f4;
  EXPECT_GT(c4 / c1, 10.0) << c1 << " -> " << c4;  // the check can tell the two apart
  EXPECT_LT(f4, c4 / 10);
}

TEST(FusedLayerNorm, GradientsMatchTheComposite) {
  const int64_t R = 29, D = 45;
  const std::vector<std::vector<float>> vals = {randoms(R * D, 4, -2, 2), randoms(D, 5, 0.5, 1.5),
                                                randoms(D, 6)};
  Outcome fused, comp;
  for (int which = 0; which < 2; ++which) {
    Context ctx;
    Tensor x = ctx.param(f32, {R, D}, "x"), w = ctx.param(f32, {D}, "w"),
           b = ctx.param(f32, {D}, "b");
    Tensor out;
    if (which == 0) {
      out = layer_norm(x, w, b);
      EXPECT_EQ(out.op(), Op::LAYER_NORM);
    } else {
      Tensor xc = x - mean(x, -1, true);
      out = xc / sqrt(scale(mean(sqr(xc), -1, true), 1.0f, 1e-5f)) * w + b;
    }
    (which == 0 ? fused : comp) = run_graph(ctx, out, {x, w, b}, vals);
  }
  EXPECT_LT(max_diff(fused.out, comp.out), 2e-6);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LT(max_diff(fused.grads[i], comp.grads[i]), 2e-5) << "grad " << i;
}

TEST(FusedCrossEntropy, MatchesTheCompositeAndStaysFiniteWithNegInf) {
  const int64_t N = 50, C = 256;
  std::vector<float> logits = randoms(N * C, 7, -4, 4);
  std::vector<int32_t> labels(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) labels[size_t(i)] = int32_t((i * 37) % C);
  Outcome fused, comp;
  for (int which = 0; which < 2; ++which) {
    Context ctx;
    Tensor x = ctx.param(f32, {N, C}, "x");
    Tensor y = ctx.input(i32, {N}, "y");
    Tensor loss = which == 0 ? cross_entropy(x, y)
                             : scale(sum(one_hot(y, C) * log_softmax(x)), -1.0f / float(N));
    if (which == 0) EXPECT_EQ(loss.op(), Op::CROSS_ENTROPY);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    CpuBackend cpu(2);
    GraphAllocator galloc(cpu.buffer_type());
    galloc.alloc(g);
    x.set<float>(logits);
    y.set<int32_t>(labels);
    g.reset_grads();
    cpu.compute(g);
    (which == 0 ? fused : comp) = Outcome{{loss.item()}, {g.grad(x).get<float>()}};
  }
  EXPECT_NEAR(fused.out[0], comp.out[0], 2e-6);
  EXPECT_LT(max_diff(fused.grads[0], comp.grads[0]), 1e-7);

  // -inf in a non-target logit: PyTorch's finite loss, log(e^1 + e^2) - 2 here.
  Context ctx;
  Tensor x = ctx.input(f32, {1, 3}, "x");
  Tensor y = ctx.input(i32, {1}, "y");
  Tensor loss = cross_entropy(x, y);
  Graph g = Graph::forward(loss);
  CpuBackend cpu(1);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  x.set<float>({1.0f, -std::numeric_limits<float>::infinity(), 2.0f});
  y.set<int32_t>({2});
  cpu.compute(g);
  EXPECT_NEAR(loss.item(), std::log(std::exp(1.0) + std::exp(2.0)) - 2.0, 1e-6);
}
