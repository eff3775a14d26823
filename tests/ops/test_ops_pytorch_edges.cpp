// Edge values computed as PyTorch computes them: masked
// entries of a causal log_softmax get no gradient, cross_entropy with labels
// ignores -inf logits of other classes, d pow(x, 0) / dx = 0 at x = 0, and
// sign(NaN) = 0. Expected values are worked out by hand from PyTorch's rules
// (the comments give them) and the graphs run on the CPU backend.
// bf16 matmul: torch.matmul of bf16 tensors on the CPU (oneDNN) multiplies the
// bf16 values exactly and accumulates in f32; kiln returns that f32 accumulator
// (PyTorch rounds it to bf16 for its bf16 output).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error_check.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Runs forward + backward of `loss` on the CPU with the given leaf values.
struct EdgeRun {
  Context ctx;
  Graph g;
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf;
  // Forward graph of `out` with memory, for leaves set by the caller (then compute).
  void prepare(Tensor out) {
    g = Graph::forward(out);
    buf = allocate_tensors(ctx, cpu);
  }
  void go(Tensor loss, std::initializer_list<std::pair<Tensor, std::vector<float>>> values,
          bool backward = true) {
    g = Graph::forward(loss);
    if (backward) g.backward(loss);
    buf = allocate_tensors(ctx, cpu);
    for (const auto& [t, v] : values) Tensor(t).set(v);
    cpu.compute(g);
  }
};

void expect_floats(const std::vector<float>& got, const std::vector<double>& want, double tol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    if (std::isinf(want[k])) EXPECT_EQ(double(got[k]), want[k]) << "element " << k;
    else EXPECT_NEAR(got[k], want[k], tol) << "element " << k;
  }
}

// PyTorch: log_softmax(x.masked_fill(causal_mask, -inf)). masked_fill's backward
// zeroes the masked entries; the log_softmax backward g - exp(y) * sum(g) sums
// over every entry, the masked ones included.
TEST(OpsPytorchEdges, CausalLogSoftmaxGivesNoGradientToMaskedEntries) {
  EdgeRun r;
  Tensor x = r.ctx.param(f32, {2, 2}, "x");
  Tensor w = r.ctx.input(f32, {2, 2}, "w");
  SoftmaxOptions o;
  o.causal = true;
  r.go(sum(mul(log_softmax(x, o), w)), {{x, {0.5f, -1.0f, 2.0f, 0.25f}}, {w, {1, 2, 3, 4}}});
  // Row 0 keeps col 0 only: p = [1, 0], dx = [1 - 1 * (1 + 2), 0].
  // Row 1 keeps both: p = softmax([2, 0.25]), dx = [3, 4] - p * 7.
  const double e0 = std::exp(2.0), e1 = std::exp(0.25), p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
  expect_floats(r.g.grad(x).get<float>(), {-2, 0, 3 - 7 * p0, 4 - 7 * p1}, 1e-6);
}

TEST(OpsPytorchEdges, CausalLogSoftmaxBatchedAndScaledGradient) {
  // [2, 2, 3]: R = 2, C = 3, so row 0 masks col 2 and row 1 masks nothing.
  EdgeRun r;
  Tensor x = r.ctx.param(f32, {2, 2, 3}, "x");
  SoftmaxOptions o;
  o.causal = true;
  o.scale = 0.5f;
  // The mask makes the loss -inf; only the gradient is checked.
  r.go(sum(log_softmax(x, o)), {{x, {1, 2, 3, 4, 5, 6, -1, 0, 1, 2, 2, 2}}});
  std::vector<double> want;
  const double xs[2][2][3] = {{{1, 2, 3}, {4, 5, 6}}, {{-1, 0, 1}, {2, 2, 2}}};
  for (const auto& b : xs)
    for (int row = 0; row < 2; ++row) {
      const int kept = row == 0 ? 2 : 3;
      double z = 0;
      for (int c = 0; c < kept; ++c) z += std::exp(0.5 * b[row][c]);
      for (int c = 0; c < 3; ++c)  // g = 1 everywhere: sum(g) = 3 over the whole row
        want.push_back(c < kept ? 0.5 * (1 - std::exp(0.5 * b[row][c]) / z * 3) : 0.0);
    }
  expect_floats(r.g.grad(x).get<float>(), want, 1e-6);
}

TEST(OpsPytorchEdges, CausalSoftmaxGivesNoGradientToMaskedEntries) {
  EdgeRun r;
  Tensor x = r.ctx.param(f32, {2, 2}, "x");
  Tensor w = r.ctx.input(f32, {2, 2}, "w");
  SoftmaxOptions o;
  o.causal = true;
  r.go(sum(mul(softmax(x, o), w)), {{x, {0.5f, -1.0f, 2.0f, 0.25f}}, {w, {1, 2, 3, 4}}});
  const double e0 = std::exp(2.0), e1 = std::exp(0.25), p0 = e0 / (e0 + e1), p1 = e1 / (e0 + e1);
  const double s = 3 * p0 + 4 * p1;
  expect_floats(r.g.grad(x).get<float>(), {0, 0, p0 * (3 - s), p1 * (4 - s)}, 1e-6);
}

// PyTorch's cross_entropy(logits, labels) picks -log_softmax at the label; -inf
// logits of other classes (masked actions) contribute nothing.
TEST(OpsPytorchEdges, CrossEntropyLabelsIgnoreNegInfLogitsOfOtherClasses) {
  EdgeRun r;
  Tensor logits = r.ctx.param(f32, {2, 3}, "logits");
  Tensor labels = r.ctx.input(i32, {2}, "labels");
  Tensor loss = cross_entropy(logits, labels);
  r.go(loss, {{logits, {0, -kInf, 1, 2, 0.5f, -kInf}}});
  labels.set(std::vector<int32_t>{0, 1});
  r.cpu.compute(r.g);
  r.g.reset_grads();
  r.cpu.compute(r.g);
  const double z0 = 1 + std::exp(1.0), z1 = std::exp(2.0) + std::exp(0.5);
  const double want = (std::log(z0) + (std::log(z1) - 0.5)) / 2;
  EXPECT_TRUE(std::isfinite(loss.item())) << loss.item();
  EXPECT_NEAR(loss.item(), want, 1e-6);
  // d loss / d logits = (softmax - one_hot) / N, exactly 0 at the -inf logits.
  expect_floats(r.g.grad(logits).get<float>(),
                {(1 / z0 - 1) / 2, 0, std::exp(1.0) / z0 / 2, std::exp(2.0) / z1 / 2,
                 (std::exp(0.5) / z1 - 1) / 2, 0},
                1e-6);
}

// PyTorch: pow's backward is zeros_like(x) when the exponent is 0.
TEST(OpsPytorchEdges, PowWithExponentZeroHasZeroGradientAtZero) {
  EdgeRun r;
  Tensor x = r.ctx.param(f32, {4}, "x");
  Tensor y = pow(x, 0.0f);
  r.go(sum(y), {{x, {0, 2, -1, -0.0f}}});
  expect_floats(y.get<float>(), {1, 1, 1, 1}, 0);
  expect_floats(r.g.grad(x).get<float>(), {0, 0, 0, 0}, 0);
}

// PyTorch: sign(x) = (0 < x) - (x < 0), so NaN (of either sign bit) gives 0.
TEST(OpsPytorchEdges, SignOfNaNIsZero) {
  EdgeRun r;
  Tensor x = r.ctx.input(f32, {19}, "x");
  Tensor y = sign(x);
  // More elements than one SIMD register, so the vector and the tail paths both see NaN.
  std::vector<float> v = {kNaN, -kNaN, -2, 0, 3, -0.0f, kInf, -kInf};
  while (v.size() < 19) v.push_back(v.size() % 2 ? kNaN : -1.5f);
  r.go(y, {{x, v}}, false);
  std::vector<double> want;
  for (float f : v) want.push_back(std::isnan(f) ? 0 : f > 0 ? 1 : f < 0 ? -1 : 0);
  expect_floats(y.get<float>(), want, 0);
}

// Leaves of bf16 values (exact: every value given is a bf16).
std::vector<uint16_t> bf16s(const std::vector<float>& v) {
  std::vector<uint16_t> h;
  for (float x : v) h.push_back(f32_to_bf16(x));
  return h;
}

// 17 x K @ K x 5: too many rows and columns for the unpacked GEMM paths, so the
// blocked one runs (on AVX512_BF16 machines its vdpbf16ps kernel).
TEST(OpsPytorchEdges, BF16MatmulAccumulatesInF32) {
  EdgeRun r;
  Tensor a = r.ctx.input(bf16, {17, 5}, "a");
  Tensor b = r.ctx.input(bf16, {5, 5}, "b");
  Tensor c = matmul(a, b);
  // Column j sums 1 + 2^-10 + 2^-10 + 2^-12 + j 2^-16: exact in f32 (16 bits),
  // 1 when rounded to bf16 after every add.
  std::vector<float> bv;
  for (float row : {1.0f, 0x1p-10f, 0x1p-10f, 0x1p-12f})
    for (int j = 0; j < 5; ++j) bv.push_back(row);
  for (int j = 0; j < 5; ++j) bv.push_back(float(j) * 0x1p-16f);
  r.prepare(c);
  a.set(bf16s(std::vector<float>(17 * 5, 1.0f)));
  b.set(bf16s(bv));
  r.cpu.compute(r.g);
  std::vector<double> want;
  for (int i = 0; i < 17; ++i)
    for (int j = 0; j < 5; ++j) want.push_back(1 + 0x1p-9 + 0x1p-12 + j * 0x1p-16);
  expect_floats(c.get<float>(), want, 0);
}

// IEEE rules on f32 accumulators: inf * 0 = NaN, NaN spreads, 2^100 * 2^100
// overflows to inf (bf16 has f32's exponent range, so only the sum can overflow).
TEST(OpsPytorchEdges, BF16MatmulInfNaNAndOverflow) {
  EdgeRun r;
  Tensor a = r.ctx.input(bf16, {17, 2}, "a");
  Tensor b = r.ctx.input(bf16, {2, 5}, "b");
  Tensor c = matmul(a, b);
  r.prepare(c);
  std::vector<float> av = {kInf, 1, 0x1p100f, 0, kNaN, 0};
  while (av.size() < 34) av.push_back(1);
  a.set(bf16s(av));
  b.set(bf16s({1, 0, 0x1p100f, 1, -1, 1, 1, 1, 1, 1}));
  r.cpu.compute(r.g);
  std::vector<double> want = {kInf,    kNaN, kInf, kInf,    -kInf,     // inf, 1
                              0x1p100, 0,    kInf, 0x1p100, -0x1p100,  // 2^100, 0
                              kNaN,    kNaN, kNaN, kNaN,    kNaN};     // NaN, 0
  for (int i = 3; i < 17; ++i)
    for (float b0 : {1.0f, 0.0f, 0x1p100f, 1.0f, -1.0f}) want.push_back(b0 + 1.0f);
  const std::vector<float> got = c.get<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) {
    if (std::isnan(want[k])) EXPECT_TRUE(std::isnan(got[k])) << "element " << k;
    else EXPECT_EQ(double(got[k]), want[k]) << "element " << k;
  }
}

// bf16 attention (torch.softmax(q @ k^T * scale) @ v of the bf16 values, softmax
// in f32 as PyTorch's CPU autocast runs it): the scores are exact products
// accumulated in f32 and the softmax subtracts the row max, so scores of 2^60
// do not overflow; one key ahead by 2^59 takes all the weight, and equal scores
// share it equally. Every result is a bf16 value, so the bf16 output is exact,
// on the vdpbf16ps kernel (which rounds P to bf16: 1 and 0 are bf16) and on
// the f32 one alike. Rows: q = (2^30, 0), (0, 0), (2^30, 2^30).
TEST(OpsPytorchEdges, BF16AttentionHugeScoresAndTies) {
  EdgeRun r;
  Tensor q = r.ctx.input(bf16, {1, 3, 2}, "q");
  Tensor k = r.ctx.input(bf16, {1, 2, 2}, "k");
  Tensor v = r.ctx.input(bf16, {1, 2, 2}, "v");
  Tensor o = attention(q, k, v, {1.0f, false}).to(f32);
  r.prepare(o);
  q.set(bf16s({0x1p30f, 0, 0, 0, 0x1p30f, 0x1p30f}));
  // Keys (2^30, 0) and (2^29, 2^29): scores 2^60 and 2^59 for row 0, both
  // 0 for row 1, 2^60 and 2^60 for row 2.
  k.set(bf16s({0x1p30f, 0, 0x1p29f, 0x1p29f}));
  v.set(bf16s({1.5f, -2, 0.25f, 4}));
  r.cpu.compute(r.g);
  EXPECT_EQ(o.dtype(), f32);
  expect_floats(o.get<float>(), {1.5, -2, 0.875, 1, 0.875, 1}, 0);
}

// PyTorch's F.cross_entropy(logits, labels, ignore_index=-100): an ignored row
// adds nothing to the loss or the denominator and gets an exactly zero
// gradient, whatever its logits (NaN here). Two of three rows count.
TEST(OpsPytorchEdges, CrossEntropyIgnoreIndexSkipsRowsEntirely) {
  EdgeRun r;
  Tensor logits = r.ctx.param(f32, {3, 2}, "logits");
  Tensor labels = r.ctx.input(i32, {3}, "labels");
  Tensor w = r.ctx.input(f32, {3}, "w");
  Tensor loss = cross_entropy(logits, labels, {.ignore_index = kIgnoreIndex, .weight = w});
  r.go(loss, {{logits, {1, 0, kNaN, kNaN, 0, 2}}, {w, {3, 5, 1}}});
  labels.set(std::vector<int32_t>{0, kIgnoreIndex, 1});
  r.g.reset_grads();
  r.cpu.compute(r.g);
  // Row losses: log(1 + e^-1) and log(1 + e^-2); weights 3 and 1: mean over 4.
  const double l0 = std::log(1 + std::exp(-1.0)), l2 = std::log(1 + std::exp(-2.0));
  EXPECT_NEAR(loss.item(), (3 * l0 + l2) / 4, 1e-6);
  const double p0 = 1 / (1 + std::exp(-1.0)), p2 = 1 / (1 + std::exp(2.0));
  expect_floats(r.g.grad(logits).get<float>(),
                {3 * (p0 - 1) / 4, 3 * (1 - p0) / 4, 0, 0, p2 / 4, -p2 / 4}, 1e-6);
}

// Where nothing counts kiln returns 0 (PyTorch: 0 / 0 = NaN), so a micro-batch
// of a trainer's with no trained token adds nothing instead of poisoning the step.
TEST(OpsPytorchEdges, CrossEntropyWithEveryLabelIgnoredIsZero) {
  EdgeRun r;
  Tensor logits = r.ctx.param(f32, {2, 3}, "logits");
  Tensor labels = r.ctx.input(i32, {2}, "labels");
  Tensor loss = cross_entropy(logits, labels, {.ignore_index = kIgnoreIndex});
  r.go(loss, {{logits, {1, 2, 3, 4, 5, 6}}});
  labels.set(std::vector<int32_t>{kIgnoreIndex, kIgnoreIndex});
  r.g.reset_grads();
  r.cpu.compute(r.g);
  EXPECT_EQ(loss.item(), 0.0f);
  expect_floats(r.g.grad(logits).get<float>(), {0, 0, 0, 0, 0, 0}, 0);
}

TEST(OpsPytorchEdges, CrossEntropyOptionsRefuseWhatTheyCannotTake) {
  Context ctx;
  Tensor logits = ctx.param(f32, {4, 10}, "logits");
  Tensor labels = ctx.input(i32, {4}, "labels");
  EXPECT_KILN_ERROR(cross_entropy(logits, labels, {.weight = ctx.input(f32, {5}, "w")}),
                    "cross_entropy", "weight", "'w'", "[5]", "[4]");
  EXPECT_KILN_ERROR(cross_entropy(logits, labels, {.weight = ctx.input(i32, {4}, "w")}),
                    "cross_entropy", "weight");
  EXPECT_KILN_ERROR(cross_entropy(logits, ctx.input(f32, {4, 10}), {.ignore_index = kIgnoreIndex}),
                    "cross_entropy", "i32 labels [4]", "f32 [4, 10]");
  // Weights are constants: one that wants a gradient is refused by backward.
  Tensor w = ctx.param(f32, {4}, "w");
  Tensor loss = cross_entropy(logits, labels, {.weight = w});
  Graph g = Graph::forward(loss);
  EXPECT_KILN_ERROR(g.backward(loss), "cross_entropy", "weight", "'w'", "constants");
}

}  // namespace
}  // namespace kiln
