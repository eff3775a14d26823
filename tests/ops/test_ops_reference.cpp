// Hand-computed checks of the double reference itself (so that "the CPU agrees
// with the reference" means something). Pure host code: no backend runs here.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"
#include "ops/harness/check.h"

namespace kiln::test {
namespace {

struct Ref {
  Context ctx;
  RefValues vals;
  Tensor leaf(const Shape& s, std::vector<double> v, DType t = DType::f32) {
    Tensor x = ctx.input(t, s);
    RefValue& r = vals[x.node()];
    r.dtype = t;
    r.shape = s;
    r.v = std::move(v);
    return x;
  }
  std::vector<double> eval(Tensor out) {
    Graph g = Graph::forward(out);
    ref_eval(g.nodes(), vals);
    return vals.at(out.node()).v;
  }
};

void expect_near(const std::vector<double>& got, const std::vector<double>& want,
                 double tol = 1e-12) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size(); ++k) EXPECT_NEAR(got[k], want[k], tol) << "element " << k;
}

TEST(OpsReference, Softmax) {
  Ref r;
  Tensor x = r.leaf({1, 3}, {1, 2, 3});
  const double s = std::exp(1) + std::exp(2) + std::exp(3);
  expect_near(r.eval(softmax(x)), {std::exp(1) / s, std::exp(2) / s, std::exp(3) / s});
  expect_near(r.eval(log_softmax(x)), {1 - std::log(s), 2 - std::log(s), 3 - std::log(s)});
}

TEST(OpsReference, CausalMaskAlignsToTheLastColumn) {
  Ref r;
  Tensor x = r.leaf({2, 3}, {0, 0, 0, 0, 0, 0});
  const SoftmaxParams p{1, true};
  // R=2, C=3: row 0 masks col 2 (> 0 + 1); row 1 masks nothing.
  expect_near(r.eval(detail::make_op(Op::SOFTMAX, DType::f32, {2, 3}, {x}, p)),
              {0.5, 0.5, 0, 1. / 3, 1. / 3, 1. / 3});
}

TEST(OpsReference, MatmulBroadcastsBatch) {
  Ref r;
  Tensor a = r.leaf({2, 1, 2}, {1, 2, 3, 4});  // two [1,2] matrices
  Tensor b = r.leaf({2, 1}, {10, 100});        // one [2,1] matrix
  expect_near(r.eval(detail::make_op(Op::MATMUL, DType::f32, {2, 1, 1}, {a, b})), {210, 430});
}

TEST(OpsReference, MaxPoolBackFirstMaxWins) {
  Ref r;
  Tensor x = r.leaf({1, 1, 2, 2}, {5, 5, 5, 5});
  Tensor g = r.leaf({1, 1, 1, 1}, {7});
  const Pool2dParams p{2, 2, 2, 2, 0, 0};
  expect_near(r.eval(detail::make_op(Op::MAX_POOL2D_BACK, DType::f32, {1, 1, 2, 2}, {x, g}, p)),
              {7, 0, 0, 0});
}

TEST(OpsReference, Im2colColumnOrderAndPadding) {
  Ref r;
  Tensor x = r.leaf({1, 2, 2, 2}, {1, 2, 3, 4, 5, 6, 7, 8});
  Conv2dParams p{2, 2, 1, 1, 0, 0, 1, 1};
  expect_near(r.eval(detail::make_op(Op::IM2COL, DType::f32, {1, 8, 1}, {x}, p)),
              {1, 2, 3, 4, 5, 6, 7, 8});
  // 1x1 input, 3x3 kernel, padding 1: one window, the input in the middle column.
  Ref r2;
  Tensor y = r2.leaf({1, 1, 1, 1}, {9});
  p = Conv2dParams{3, 3, 1, 1, 1, 1, 1, 1};
  expect_near(r2.eval(detail::make_op(Op::IM2COL, DType::f32, {1, 9, 1}, {y}, p)),
              {0, 0, 0, 0, 9, 0, 0, 0, 0});
}

TEST(OpsReference, PadRepeatConcat) {
  Ref r;
  Tensor x = r.leaf({1, 2}, {1, 2});
  PadParams p;
  p.before[1] = 1;
  p.value = 9;
  expect_near(r.eval(detail::make_op(Op::PAD, DType::f32, {1, 3}, {x}, p)), {9, 1, 2});
  expect_near(r.eval(detail::make_op(Op::REPEAT, DType::f32, {2, 4}, {x})),
              {1, 2, 1, 2, 1, 2, 1, 2});
  Tensor t = r.leaf({2, 4}, {1, 2, 3, 4, 5, 6, 7, 8});
  expect_near(r.eval(detail::make_op(Op::REPEAT_BACK, DType::f32, {1, 2}, {t})),
              {1 + 3 + 5 + 7, 2 + 4 + 6 + 8});
  const ConcatParams c{0};
  expect_near(r.eval(detail::make_op(Op::CONCAT, DType::f32, {2, 2}, {x, x}, c)), {1, 2, 1, 2});
}

TEST(OpsReference, CopiesRoundLikeStorage) {
  Ref r;
  Tensor x = r.leaf({3}, {1.0 / 3.0, -2.7, 70000});
  const std::vector<double> h = r.eval(detail::make_op(Op::COPY, DType::f16, {3}, {x}));
  EXPECT_EQ(h[0], double(f16_to_f32(f32_to_f16(float(1.0 / 3.0)))));
  EXPECT_NE(h[0], 1.0 / 3.0);
  EXPECT_TRUE(std::isinf(h[2]));  // beyond f16's range
  expect_near(r.eval(detail::make_op(Op::COPY, DType::i32, {3}, {x})), {0, -2, 70000});
}

TEST(OpsReference, RandMaskUsesTheSharedRng) {
  Ref r;
  Tensor seed = r.leaf({1}, {5}, DType::i32);
  const RandMaskParams p{40, 0.5f};
  const std::vector<double> m = r.eval(detail::make_op(Op::RAND_MASK, DType::f32, {64}, {seed}, p));
  for (size_t k = 0; k < m.size(); ++k)
    EXPECT_EQ(m[k], kiln::detail::rng_uniform(40 ^ 5, k) < 0.5f ? 1.0 : 0.0);
}

TEST(OpsReference, ArgmaxFirstMaxAndReductions) {
  Ref r;
  Tensor x = r.leaf({2, 3}, {1, 3, 3, 4, 4, -1});
  ReduceParams p{1, false};
  expect_near(r.eval(detail::make_op(Op::ARGMAX, DType::i32, {2}, {x}, p)), {1, 0});
  expect_near(r.eval(detail::make_op(Op::SUM, DType::f32, {2}, {x}, p)), {7, 7});
  p = ReduceParams{0, true};
  expect_near(r.eval(detail::make_op(Op::MAX, DType::f32, {1, 3}, {x}, p)), {4, 4, 3});
}

TEST(OpsReference, RejectsWrongShapes) {
  Ref r;
  Tensor a = r.leaf({2, 3}, {1, 2, 3, 4, 5, 6});
  Tensor b = r.leaf({3}, {1, 1, 1});
  EXPECT_THROW(r.eval(detail::make_op(Op::ADD, DType::f32, {3, 2}, {a, b})), RefError);
  EXPECT_THROW(r.eval(detail::make_op(Op::MATMUL, DType::f32, {2, 3}, {a, a})), RefError);
}

}  // namespace
}  // namespace kiln::test
