// The q8_0 / q4_0 dtypes: quantize_row / dequantize_row byte for byte against
// fixtures of ggml's reference formulas (quant/make_quant_fixtures.py), the
// same through Tensor::set/get and the COPY op (quantize and dequantize on the
// CPU), block layout and strides, and the errors of everything that refuses a
// quantized tensor.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"
#include "quant/quant_fixtures.h"

namespace {

using kiln::DType;
using kiln::f32;
using kiln::q4_0;
using kiln::q8_0;
using kiln::Tensor;

std::vector<float> fixture_input() {
  std::vector<float> x(quant_fixture::kCount);
  std::memcpy(x.data(), quant_fixture::kInput, x.size() * 4);
  return x;
}

std::vector<uint8_t> fixture_bytes(DType t) {
  if (t == q8_0) return {std::begin(quant_fixture::kQ8_0), std::end(quant_fixture::kQ8_0)};
  return {std::begin(quant_fixture::kQ4_0), std::end(quant_fixture::kQ4_0)};
}

std::vector<uint32_t> fixture_value_bits(DType t) {
  if (t == q8_0)
    return {std::begin(quant_fixture::kQ8_0Values), std::end(quant_fixture::kQ8_0Values)};
  return {std::begin(quant_fixture::kQ4_0Values), std::end(quant_fixture::kQ4_0Values)};
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> b(v.size());
  std::memcpy(b.data(), v.data(), v.size() * 4);
  return b;
}

class QuantFormat : public ::testing::TestWithParam<DType> {};

TEST_P(QuantFormat, RowsMatchGgmlReferenceBytes) {
  const DType t = GetParam();
  const std::vector<float> x = fixture_input();
  std::vector<uint8_t> q(kiln::dtype_row_bytes(t, int64_t(x.size())));
  kiln::quantize_row(t, x.data(), q.data(), int64_t(x.size()));
  EXPECT_EQ(q, fixture_bytes(t));
  std::vector<float> y(x.size());
  kiln::dequantize_row(t, q.data(), y.data(), int64_t(y.size()));
  EXPECT_EQ(bits(y), fixture_value_bits(t));
}

TEST_P(QuantFormat, TensorSetGetAndCopyOpMatchTheReference) {
  const DType t = GetParam();
  const std::vector<float> x = fixture_input();
  const int64_t rows = quant_fixture::kCount / 64;
  kiln::Context ctx;
  Tensor w = ctx.param(t, {rows, 64}, "w");
  Tensor xf = ctx.input(f32, {rows, 64}, "x");
  // x.T().T() is strided: the quantizer gathers it; w.to(f32) dequantizes.
  Tensor xt = ctx.input(f32, {64, rows}, "xt");
  Tensor q = xf.to(t), qt = xt.T().to(t), deq = w.to(f32);
  kiln::Graph g = kiln::Graph::forward({q, qt, deq});
  kiln::CpuBackend cpu(2);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  w.set(x);  // quantized on the host
  EXPECT_EQ(w.get<uint8_t>(), fixture_bytes(t));
  EXPECT_EQ(bits(w.get<float>()), fixture_value_bits(t));
  xf.set(x);
  std::vector<float> xtv(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < 64; ++c) xtv[size_t(c * rows + r)] = x[size_t(r * 64 + c)];
  xt.set(xtv);
  cpu.compute(g);
  EXPECT_EQ(q.get<uint8_t>(), fixture_bytes(t));
  EXPECT_EQ(qt.get<uint8_t>(), fixture_bytes(t));
  EXPECT_EQ(bits(deq.get<float>()), fixture_value_bits(t));
  // Raw bytes load as they are.
  w.set(std::vector<uint8_t>(w.node()->nbytes(), 0));
  EXPECT_EQ(w.get<float>(), std::vector<float>(x.size(), 0.0f));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantFormat, ::testing::Values(q8_0, q4_0),
                         [](const auto& i) { return std::string(kiln::dtype_name(i.param)); });

TEST(Quant, LayoutIsGgmls) {
  kiln::Context ctx;
  Tensor w = ctx.param(q4_0, {3, 5, 64}, "w");
  const auto* n = w.node();
  EXPECT_EQ(n->nbytes(), size_t(3 * 5 * 2 * 18));
  EXPECT_EQ(n->stride[2], 18);       // one block
  EXPECT_EQ(n->stride[1], 2 * 18);   // one row
  EXPECT_EQ(n->stride[0], 10 * 18);  // one matrix
  EXPECT_TRUE(n->is_contiguous());
  EXPECT_EQ(n->quant_axis(), 2);
  Tensor wt = w.T();
  EXPECT_FALSE(wt.node()->is_contiguous());
  EXPECT_EQ(wt.node()->quant_axis(), 1);
  EXPECT_EQ(wt.T().node()->quant_axis(), 2);
  EXPECT_EQ(w.narrow(1, 1, 2).node()->quant_axis(), 2);
  EXPECT_EQ(w.view({15, 64}).node()->nbytes(), n->nbytes());
  Tensor w8 = ctx.param(q8_0, {32, 32}, "w8");  // one block per row: row and block strides agree
  EXPECT_EQ(w8.T().node()->quant_axis(), 0);
  EXPECT_EQ(w8.T().T().node()->quant_axis(), 1);
  // Its transpose has the same strides as w8 itself, but its blocks run down
  // the columns: not contiguous, so get() and contiguous() refuse it.
  EXPECT_FALSE(w8.T().node()->is_contiguous());
  EXPECT_TRUE(w8.T().T().node()->is_contiguous());
  for (int64_t n : {32, 48}) {
    Tensor one = ctx.param(q8_0, {n, 32}, "one_block_rows");
    EXPECT_FALSE(one.T().node()->is_contiguous()) << n;
  }
}

// x @ W^T with x broadcast over rows (an expanded x has row stride 0): the
// builder gives the kernel whole rows, as with an f32 weight.
TEST(Quant, MatmulOfAnExpandedInputEqualsTheRepeatedRows) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {1, 64}, "x");
  Tensor w = ctx.param(q8_0, {8, 64}, "w");
  Tensor y = kiln::matmul(x.expand({6, 64}), w.T());
  Tensor y1 = kiln::matmul(x, w.T());
  kiln::Graph g = kiln::Graph::forward({y, y1});
  kiln::CpuBackend cpu(2);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  std::vector<float> xv(64), wv(8 * 64);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i % 7) - 3) * 0.25f;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(int(i % 11) - 5) * 0.125f;
  x.set(xv);
  w.set(wv);
  cpu.compute(g);
  const std::vector<float> got = y.get<float>(), row = y1.get<float>();
  ASSERT_EQ(got.size(), size_t(6 * 8));
  // Six rows of the 6-row (exact) path against the one-row path's product,
  // which may round x to int8 blocks (qmatmul.h): equal within that bound.
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], row[i % 8], 0.05) << i;
  EXPECT_NE(got, std::vector<float>(got.size(), 0.0f));
}

TEST(Quant, ErrorsNameTheOpAndTheDtype) {
  kiln::Context ctx;
  Tensor w = ctx.param(q8_0, {4, 64}, "w");
  Tensor x = ctx.input(f32, {4, 64}, "x");
  EXPECT_KILN_ERROR(ctx.param(q8_0, {4, 48}, "bad"), "param", "q8_0", "[4, 48]", "multiple of 32");
  EXPECT_KILN_ERROR((void)kiln::add(w, w), "add", "q8_0");
  EXPECT_KILN_ERROR((void)kiln::relu(w), "relu", "q8_0");
  EXPECT_KILN_ERROR((void)kiln::sum(w), "sum", "q8_0");
  EXPECT_KILN_ERROR((void)w.expand({2, 4, 64}), "expand", "q8_0");
  EXPECT_KILN_ERROR((void)w.narrow(1, 0, 32), "narrow", "q8_0", "blocks of 32");
  EXPECT_KILN_ERROR((void)w.view({8, 32}), "view", "q8_0", "[8, 32]");
  EXPECT_KILN_ERROR((void)w.T().contiguous(), "contiguous", "q8_0", ".to(f32)");
  EXPECT_KILN_ERROR((void)w.to(kiln::bf16), "copy", "q8_0", "bf16");
  EXPECT_KILN_ERROR((void)w.to(q4_0), "copy", "q8_0", "q4_0");
  EXPECT_KILN_ERROR((void)w.T().to(f32), "copy", "transposed");
  EXPECT_KILN_ERROR((void)x.to(kiln::bf16).to(q8_0), "copy", "only f32", "q8_0");
  EXPECT_KILN_ERROR((void)kiln::zeros(ctx, {4, 64}, q4_0), "full", "q4_0");
  kiln::CpuBackend cpu(1);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  EXPECT_KILN_ERROR(w.set(std::vector<float>(3)), "set", "'w'", "q8_0", "256");
  EXPECT_KILN_ERROR((void)w.get<int32_t>(), "get", "'w'", "q8_0", "uint8_t");
  EXPECT_KILN_ERROR((void)w.T().get<float>(), "get", "not contiguous");
  EXPECT_KILN_ERROR(kiln::quantize_row(kiln::f16, nullptr, nullptr, 32), "quantize", "f16");
  EXPECT_KILN_ERROR(kiln::quantize_row(q4_0, nullptr, nullptr, 33), "quantize", "33");
}

TEST(Quant, AQuantizedParamThatIsNotFrozenGetsNoGradient) {
  kiln::Context ctx;
  Tensor w = ctx.param(q8_0, {4, 64}, "w");
  Tensor b = ctx.param(f32, {64}, "b");
  Tensor loss = kiln::sum(kiln::mul(kiln::add(w.to(f32), b), kiln::add(w.to(f32), b)));
  kiln::Graph g = kiln::Graph::forward({loss});
  EXPECT_KILN_ERROR(g.backward(loss), "backward", "'w'", "q8_0", "freeze");
  // Frozen, it is a constant: b alone gets a gradient.
  kiln::Context ctx2;
  Tensor w2 = ctx2.param(q8_0, {4, 64}, "w");
  w2.set_requires_grad(false);
  Tensor b2 = ctx2.param(f32, {64}, "b");
  Tensor l2 = kiln::sum(kiln::add(w2.to(f32), b2));
  kiln::Graph g2 = kiln::Graph::forward({l2});
  g2.backward(l2);
  kiln::CpuBackend cpu(1);
  auto buf = kiln::allocate_tensors(ctx2, cpu);
  w2.set(std::vector<float>(256, 1.0f));
  b2.set(std::vector<float>(64, 0.0f));
  cpu.compute(g2);
  EXPECT_EQ(g2.grad(b2).get<float>(), std::vector<float>(64, 4.0f));
  // A gradient through quantization (x.to(q8_0) of a trained x) is refused.
  kiln::Context ctx3;
  Tensor p = ctx3.param(f32, {4, 64}, "p");
  Tensor l3 = kiln::sum(p.to(q8_0).to(f32));
  kiln::Graph g3 = kiln::Graph::forward({l3});
  EXPECT_KILN_ERROR(g3.backward(l3), "copy", "quantization");
}

// The quantized product x @ W^T against the f32 product with the original W:
// |y_q - y| <= sum_c |x_c| e(c) + f32 rounding, where e is the format's bound
// on one weight's error in its block (scale d = the f32 scale, d16 its f16):
// q8_0 e = d / 2 + 127 |d - d16| (round to nearest); q4_0 e = |d| + 8 |d - d16|
// (round to nearest, but the top value 8|d| clamps to 7|d| on the side
// opposite the block's largest magnitude).
TEST_P(QuantFormat, MatmulIsWithinTheFormatsErrorOfTheF32Product) {
  const DType t = GetParam();
  const int64_t M = 5, N = 24, K = 256;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(size_t(M * K)), w(size_t(N * K));
  for (float& v : x) v = nd(rng);
  for (float& v : w) v = nd(rng) * 0.05f;
  kiln::Context ctx;
  Tensor xt = ctx.input(f32, {M, K}, "x");
  Tensor wq = ctx.param(t, {N, K}, "wq");
  Tensor wf = ctx.param(f32, {N, K}, "wf");
  Tensor yq = kiln::matmul(xt, wq.T()), yf = kiln::matmul(xt, wf.T());
  kiln::Graph g = kiln::Graph::forward({yq, yf});
  kiln::CpuBackend cpu(2);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  xt.set(x);
  wq.set(w);
  wf.set(w);
  cpu.compute(g);
  const std::vector<float> q = yq.get<float>(), f = yf.get<float>();
  // Per-weight error bounds from each block's scale.
  std::vector<double> e(w.size());
  for (size_t b = 0; b < w.size() / 32; ++b) {
    float amax = 0.0f, mx = 0.0f;
    for (size_t j = 0; j < 32; ++j)
      if (std::fabs(w[b * 32 + j]) > amax) amax = std::fabs(w[b * 32 + j]), mx = w[b * 32 + j];
    const double d = t == q8_0 ? amax / 127.0f : std::fabs(mx / -8.0f);
    const double d16 = kiln::f16_to_f32(kiln::f32_to_f16(float(d)));
    const double eb = t == q8_0 ? d / 2 + 127 * std::fabs(d - d16) : d + 8 * std::fabs(d - d16);
    for (size_t j = 0; j < 32; ++j) e[b * 32 + j] = eb;
  }
  double worst = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double bound = 1e-5, mag = 0;
      for (int64_t c = 0; c < K; ++c) {
        bound += std::fabs(x[size_t(i * K + c)]) * e[size_t(j * K + c)];
        mag += std::fabs(x[size_t(i * K + c)] * w[size_t(j * K + c)]);
      }
      bound += 1e-6 * mag;  // f32 accumulation of both products
      const double err = std::fabs(double(q[size_t(i * N + j)]) - f[size_t(i * N + j)]);
      EXPECT_LE(err, bound) << "y[" << i << ", " << j << "]";
      worst = std::max(worst, err / bound);
    }
  // The bound is not vacuous: the product does differ from the f32 one.
  EXPECT_GT(worst, 0.01);
}

TEST(Quant, MatmulTakesAQuantizedWeightOnlyAsAFrozenMatrix) {
  kiln::Context ctx;
  Tensor w = ctx.param(q8_0, {4, 64}, "w");
  Tensor w3 = ctx.param(q8_0, {2, 4, 64}, "w3");
  Tensor x = ctx.input(f32, {3, 64}, "x");
  Tensor y = ctx.input(f32, {3, 4}, "y");
  EXPECT_KILN_ERROR((void)kiln::matmul(w, x.T()), "matmul", "'w'", "q8_0", "second operand");
  EXPECT_KILN_ERROR((void)kiln::matmul(x, w3.T()), "matmul", "[2, 64, 4]", "2 dims");
  EXPECT_EQ(kiln::matmul(y, w).shape(), (kiln::Shape{3, 64}));  // dy @ W
  // A quantized weight that is a param left trainable: the backward pass refuses it.
  Tensor loss = kiln::sum(kiln::matmul(x, w.T()));
  kiln::Graph g = kiln::Graph::forward({loss});
  EXPECT_KILN_ERROR(g.backward(loss), "backward", "'w'", "q8_0", "freeze");
}

}  // namespace
