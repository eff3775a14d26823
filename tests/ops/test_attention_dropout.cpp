// attention() with dropout on its weights (AttentionOptions::dropout) against
// the composite it fuses: matmul -> softmax -> dropout -> matmul, dropout with
// the same seed and seed tensor, so the same mask (the fused kernels draw the
// dropout op's bits of the [..., Tq, Tk] weights). Outputs and the gradients
// of q, k and v agree on the small-head and the tiled kernels, causal or not,
// and after the seed tensor changes (a new mask, same graph); p = 0 is plain
// attention; the mask keeps about 1 - p of the weights, each scaled by
// 1 / (1 - p), and equals dropout()'s bit for bit; the builder's errors name
// what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error_check.h"
#include "common/random_values.h"
#include "kiln/ext/op_params.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

void check_dropout_against_composite(int64_t H, int64_t T, int64_t E, bool causal, float p) {
  SCOPED_TRACE("T " + std::to_string(T) + (causal ? " causal" : " full") + " p " +
               std::to_string(p));
  Context ctx;
  const Shape s{2, H, T, E};
  Tensor q = ctx.param(f32, s, "q"), k = ctx.param(f32, s, "k"), v = ctx.param(f32, s, "v");
  Tensor w = ctx.input(f32, s, "w");  // the loss's weights: sum(out * w)
  Tensor step = ctx.input(i32, {1}, "step");
  const float scale = 1.0f / std::sqrt(float(E));
  const uint64_t seed = 0xC0FFEE;
  AttentionOptions o{scale, causal};
  o.dropout = p;
  o.seed = seed;
  o.seed_tensor = step;
  Tensor fused = attention(q, k, v, o);
  SoftmaxOptions so;
  so.scale = scale;
  so.causal = causal;
  Tensor weights = dropout(softmax(matmul(q, k.T()), so), p, seed, true, step);
  Tensor composite = matmul(weights, v);
  Tensor lf = sum(fused * w), lc = sum(composite * w);
  Graph gf = Graph::forward(lf), gc = Graph::forward(lc);
  gf.backward(lf);
  gc.backward(lc);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  std::mt19937 rng(uint32_t(T + E));
  for (Tensor t : {q, k, v, w}) t.set(kiln_test::uniform_floats(size_t(s.numel()), rng, 1.5f));
  std::vector<float> first_out;
  for (const int32_t st : {3, 4}) {  // two steps: two masks, one graph
    SCOPED_TRACE("step " + std::to_string(st));
    step.set(std::vector<int32_t>{st});
    gf.reset_grads();
    gc.reset_grads();
    cpu.compute(gf);
    const std::vector<float> out_f = fused.get<float>();
    std::vector<std::vector<float>> grad_f;
    for (Tensor x : {q, k, v}) grad_f.push_back(gf.grad(x).get<float>());
    cpu.compute(gc);
    EXPECT_LT(kiln_test::max_abs_diff(out_f, composite.get<float>()), 3e-5);
    const char* names[] = {"dq", "dk", "dv"};
    int i = 0;
    for (Tensor x : {q, k, v}) {
      EXPECT_LT(kiln_test::max_abs_diff(grad_f[size_t(i)], gc.grad(x).get<float>()), 1e-4)
          << names[i];
      ++i;
    }
    if (first_out.empty()) first_out = out_f;
    else
      EXPECT_GT(kiln_test::max_abs_diff(first_out, out_f), 1e-2)
          << "a new step seed, the same mask";
  }
}

TEST(AttentionDropout, MatchesTheCompositeWithTheSameMask) {
  for (const bool causal : {true, false}) {
    check_dropout_against_composite(3, 37, 16, causal, 0.2f);   // small-head kernels
    check_dropout_against_composite(2, 150, 24, causal, 0.5f);  // tiled kernels
  }
}

TEST(AttentionDropout, ZeroDropoutIsPlainAttention) {
  Context ctx;
  const Shape s{2, 3, 40, 16};
  Tensor q = ctx.input(f32, s, "q"), k = ctx.input(f32, s, "k"), v = ctx.input(f32, s, "v");
  AttentionOptions o{0.0f, true};
  o.seed = 7;
  o.seed_tensor = ctx.input(i32, {1}, "step");
  Tensor with_seeds = attention(q, k, v, o);
  Tensor plain = attention(q, k, v, {0.0f, true});
  // p = 0 builds plain attention: no seed source, nothing dropped.
  EXPECT_EQ(with_seeds.node()->n_src, 3);
  EXPECT_EQ(op_params<Op::ATTENTION>(*with_seeds.node()).keep, 1.0f);
  Graph g = Graph::forward({with_seeds, plain});
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  std::mt19937 rng(5);
  for (Tensor t : {q, k, v}) t.set(kiln_test::uniform_floats(size_t(s.numel()), rng, 1.5f));
  o.seed_tensor.set(std::vector<int32_t>{11});
  cpu.compute(g);
  EXPECT_EQ(with_seeds.get<float>(), plain.get<float>());
}

// With q = 0 every visible weight is 1 / Tk, and with v the identity (E = Tk)
// row i of the output is row i of the dropped weights: factor / Tk each. The
// factors are 0 or 1 / (1 - p), about 1 - p of them kept, and they are
// dropout()'s mask of a [H, T, T] tensor with the same seeds, bit for bit.
void check_mask_statistics(int64_t H, int64_t T, float p) {
  SCOPED_TRACE("T " + std::to_string(T) + " p " + std::to_string(p));
  Context ctx;
  Tensor q = ctx.input(f32, {H, T, T}, "q"), k = ctx.input(f32, {H, T, T}, "k");
  Tensor v = ctx.input(f32, {H, T, T}, "v"), step = ctx.input(i32, {1}, "step");
  AttentionOptions o;
  o.dropout = p;
  o.seed = 1234;
  o.seed_tensor = step;
  Tensor out = attention(q, k, v, o);
  Tensor ones = ctx.input(f32, {H, T, T}, "ones");
  Tensor mask = dropout(ones, p, 1234, true, step);  // the composite's factors
  Graph g = Graph::forward({out, mask});
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  const size_t n = size_t(H * T * T);
  std::vector<float> eye(n, 0.0f);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t i = 0; i < T; ++i) eye[size_t((h * T + i) * T + i)] = 1.0f;
  q.set(std::vector<float>(n, 0.0f));
  std::mt19937 rng(9);
  k.set(kiln_test::uniform_floats(n, rng, 1.5f));
  v.set(eye);
  ones.set(std::vector<float>(n, 1.0f));
  step.set(std::vector<int32_t>{-5});
  cpu.compute(g);
  const std::vector<float> y = out.get<float>(), m = mask.get<float>();
  const double kept_value = 1.0 / (1.0 - double(p));
  int64_t kept = 0, odd = 0, differ = 0;
  for (size_t i = 0; i < n; ++i) {
    const double f = double(y[i]) * double(T);  // the factor of weight i
    const bool is_kept = std::fabs(f - kept_value) < 1e-4, is_dropped = std::fabs(f) < 1e-6;
    kept += is_kept;
    odd += !is_kept && !is_dropped;
    differ += (is_kept ? float(kept_value) : 0.0f) != m[i];
  }
  EXPECT_EQ(odd, 0) << "factors other than 0 and 1 / (1 - p)";
  EXPECT_EQ(differ, 0) << "bits other than dropout()'s";
  // Binomial: the kept fraction within 5 standard deviations of 1 - p.
  const double frac = double(kept) / double(n);
  const double sd = std::sqrt(double(p) * (1.0 - double(p)) / double(n));
  EXPECT_NEAR(frac, 1.0 - double(p), 5 * sd + 1e-9);
}

TEST(AttentionDropout, KeepsAboutOneMinusPScaledByItsInverse) {
  check_mask_statistics(8, 64, 0.2f);   // small-head kernels
  check_mask_statistics(3, 100, 0.6f);  // tiled kernels
}

TEST(AttentionDropout, BuilderErrorsNameTheProblem) {
  Context ctx;
  Tensor q = ctx.input(f32, {2, 4, 8, 16});
  AttentionOptions o;
  o.dropout = 1.0f;
  EXPECT_KILN_ERROR(attention(q, q, q, o), "attention", "dropout must be in [0, 1)", "1");
  o.dropout = 0.1f;
  o.seed_tensor = ctx.input(f32, {1});
  EXPECT_KILN_ERROR(attention(q, q, q, o), "attention", "seed_tensor", "i32");
  o.seed_tensor = ctx.input(i32, {0});
  EXPECT_KILN_ERROR(attention(q, q, q, o), "attention", "seed_tensor", "no elements");
}

}  // namespace
}  // namespace kiln
