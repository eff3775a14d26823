// Direct checks of the elementwise and copy kernels against scalar loops: dense,
// broadcast, strided and in-place operands, thread counts 1-3, dtype
// conversions. (Every op against a double reference lives in tests/ops.)
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"

namespace kiln::kernel_test {
namespace {

using cpu::kernel_ADD;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

struct BinCase {
  const char* name;
  Shape out;
  // Build a and b (any layout) in ns.
  std::function<std::pair<TensorNode*, TensorNode*>(Nodes&)> make;
};

std::vector<BinCase> binary_cases() {
  auto dense2 = [](Shape a, Shape b) {
    return [a, b](Nodes& ns) { return std::pair{ns.make(f32, a), ns.make(f32, b)}; };
  };
  return {
      {"same_shape_big", {1000003}, dense2({1000003}, {1000003})},
      {"row_bcast", {257, 129}, dense2({257, 129}, {129})},
      {"col_bcast", {257, 129}, dense2({257, 129}, {257, 1})},
      {"scalar", {64, 33}, dense2({64, 33}, {})},
      {"scalar_left", {64, 33}, dense2({1}, {64, 33})},
      {"4d_bcast", {3, 4, 5, 7}, dense2({3, 1, 5, 7}, {4, 1, 7})},
      {"transposed",
       {257, 129},
       [](Nodes& ns) {
         return std::pair{ns.transposed(f32, {257, 129}), ns.make(f32, {257, 129})};
       }},
      {"expanded",
       {100, 64},
       [](Nodes& ns) {
         TensorNode* base = ns.make(f32, {64});
         return std::pair{ns.view(base, {100, 64}, {0, 4}), ns.transposed(f32, {100, 64})};
       }},
      {"narrowed",
       {50, 30},
       [](Nodes& ns) {
         TensorNode* base = ns.make(f32, {60, 40});
         return std::pair{ns.view(base, {50, 30}, {160, 4}, 45), ns.make(f32, {50, 30})};
       }},
  };
}

float ref_binary(Op op, float a, float b) {
  switch (op) {
    case Op::ADD: return a + b;
    case Op::SUB: return a - b;
    case Op::MUL: return a * b;
    default: return a / b;
  }
}

Kernel kernel_of(Op op) {
  switch (op) {
    case Op::ADD: return cpu::kernel_ADD;
    case Op::SUB: return cpu::kernel_SUB;
    case Op::MUL: return cpu::kernel_MUL;
    default: return cpu::kernel_DIV;
  }
}

TEST(KernelsBinary, MatchScalarLoopForAnyLayoutAndThreads) {
  for (const BinCase& c : binary_cases()) {
    for (Op op : {Op::ADD, Op::SUB, Op::MUL, Op::DIV}) {
      Nodes ns;
      auto [a, b] = c.make(ns);
      fill_random(a, -3, 3, 1);
      fill_random(b, 0.5f, 4, 2);
      for (int nth : {1, 2, 3}) {
        TensorNode* d = ns.op(op, f32, c.out, {a, b});
        run(kernel_of(op), d, nth);
        int bad = 0;
        for (int64_t i = 0; i < d->numel() && bad < 5; ++i) {
          float want = ref_binary(op, at_bcast(a, c.out, i), at_bcast(b, c.out, i));
          if (!same_bits(at(d, i), want)) {
            ++bad;
            ADD_FAILURE() << c.name << " " << op_name(op) << " nth=" << nth << " i=" << i << ": "
                          << at(d, i) << " != " << want;
          }
        }
      }
    }
  }
}

TEST(KernelsBinary, InPlaceOnEitherSource) {
  for (int which : {0, 1}) {
    Nodes ns;
    TensorNode* a = ns.make(f32, {300001});
    TensorNode* b = ns.make(f32, {300001});
    fill_random(a, -1, 1, 3);
    fill_random(b, -1, 1, 4);
    std::vector<float> va = values(a), vb = values(b);
    TensorNode* d = ns.op(Op::SUB, f32, {300001}, {a, b});
    d->data = which == 0 ? a->data : b->data;
    run(cpu::kernel_SUB, d, 2);
    for (size_t i = 0; i < va.size(); ++i) ASSERT_EQ(at(d, int64_t(i)), va[i] - vb[i]) << i;
  }
}

// Outputs over 32 MiB take the non-temporal store path (with an unaligned head).
TEST(KernelsBinary, LargeOutputsStreamCorrectly) {
  const int64_t n = 9000001;
  Nodes ns;
  TensorNode* a = ns.make(f32, {n});
  TensorNode* b = ns.make(f32, {n + 1});
  TensorNode* bv = ns.view(b, {n}, {4}, 1);  // misaligned by one float
  fill_random(a, -1, 1, 15);
  fill_random(bv, -1, 1, 16);
  TensorNode* d = ns.op(Op::MUL, f32, {n}, {a, bv});
  d->data = (float*)ns.make(f32, {n + 3})->data + 3;
  run(cpu::kernel_MUL, d, 2);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(d, i), at(a, i) * at(bv, i)) << i;
  std::vector<float> before = values(bv);
  TensorNode* e = ns.op(Op::NEG, f32, {n}, {bv});
  e->data = bv->data;  // in place, misaligned
  run(cpu::kernel_NEG, e, 2);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(at(e, i), -before[size_t(i)]) << i;
}

TEST(KernelsBinary, CompareF32AndI32) {
  const float av[] = {1, 2, 3, kNaN, -0.0f, 5};
  const float bv[] = {2, 2, 1, 1, 0.0f, kNaN};
  for (DType t : {f32, i32}) {
    for (int mode = 0; mode < 6; ++mode) {
      Nodes ns;
      TensorNode* a = ns.make(t, {6});
      TensorNode* b = ns.make(t, {2, 6});
      for (int i = 0; i < 6; ++i) {
        set(a, i, t == i32 && av[i] != av[i] ? 7 : av[i]);
        set(b, i, t == i32 && bv[i] != bv[i] ? 9 : bv[i]);
        set(b, 6 + i, 3);
      }
      TensorNode* d = ns.op(Op::COMPARE, f32, {2, 6}, {a, b}, CompareParams{CompareMode(mode)});
      run(cpu::kernel_COMPARE, d, 2);
      for (int i = 0; i < 12; ++i) {
        float x = at_bcast(a, {2, 6}, i), y = at(b, i);
        bool want = mode == 0   ? x == y
                    : mode == 1 ? x != y
                    : mode == 2 ? x < y
                    : mode == 3 ? x <= y
                    : mode == 4 ? x > y
                                : x >= y;
        EXPECT_EQ(at(d, i), want ? 1.0f : 0.0f) << dtype_name(t) << " mode " << mode << " i " << i;
      }
    }
  }
}

TEST(KernelsBinary, WhereBroadcastsAllThree) {
  for (DType ct : {f32, i32}) {
    Nodes ns;
    TensorNode* c = ns.make(ct, {40, 1});
    for (int i = 0; i < 40; ++i)
      set(c, i, ct == f32 ? (i % 4 == 0 ? -0.0f : i % 4 == 1 ? kNaN : float(i % 3)) : float(i % 3));
    TensorNode* x = ns.transposed(f32, {40, 33});
    TensorNode* y = ns.make(f32, {33});
    fill_random(x, -1, 1, 5);
    fill_random(y, 2, 3, 6);
    TensorNode* d = ns.op(Op::WHERE, f32, {40, 33}, {c, x, y});
    run(cpu::kernel_WHERE, d, 2);
    for (int64_t i = 0; i < d->numel(); ++i) {
      float cv = at_bcast(c, d->shape, i);
      float want = cv != 0.0f ? at(x, i) : at_bcast(y, d->shape, i);
      ASSERT_EQ(at(d, i), want) << i;
    }
  }
}

// ---------------------------------------------------------------- unary
struct UnCase {
  Op op;
  Kernel k;
  float lo, hi;
  double (*ref)(double);
  float p0 = 0, p1 = 0;
};

double gelu_tanh_ref(double x) {
  return 0.5 * x * (1 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
double gelu_erf_ref(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double sigmoid_ref(double x) { return 1 / (1 + std::exp(-x)); }

std::vector<UnCase> unary_cases() {
  using namespace cpu;
  return {
      {Op::NEG, kernel_NEG, -5, 5, [](double x) { return -x; }},
      {Op::ABS, kernel_ABS, -5, 5, [](double x) { return std::fabs(x); }},
      {Op::SIGN, kernel_SIGN, -5, 5, [](double x) { return double((x > 0) - (x < 0)); }},
      {Op::SQR, kernel_SQR, -5, 5, [](double x) { return x * x; }},
      {Op::SQRT, kernel_SQRT, 0, 50, [](double x) { return std::sqrt(x); }},
      {Op::EXP, kernel_EXP, -80, 80, [](double x) { return std::exp(x); }},
      {Op::LOG, kernel_LOG, 1e-30f, 1e30f, [](double x) { return std::log(x); }},
      {Op::SIN, kernel_SIN, -100, 100, [](double x) { return std::sin(x); }},
      {Op::COS, kernel_COS, -100, 100, [](double x) { return std::cos(x); }},
      {Op::POW, kernel_POW, 0.1f, 10, [](double x) { return std::pow(x, 1.7); }, 1.7f},
      {Op::POW, kernel_POW, -4, 4, [](double x) { return x * x; }, 2.0f},
      {Op::POW, kernel_POW, 0, 9, [](double x) { return std::sqrt(x); }, 0.5f},
      {Op::POW, kernel_POW, 0.5, 9, [](double x) { return 1 / x; }, -1.0f},
      {Op::SCALE, kernel_SCALE, -5, 5, [](double x) { return double(2.5f * float(x) - 1.0f); },
       2.5f, -1.0f},
      {Op::CLAMP, kernel_CLAMP, -5, 5, [](double x) { return std::min(std::max(x, -1.0), 2.0); },
       -1.0f, 2.0f},
      {Op::RELU, kernel_RELU, -5, 5, [](double x) { return x > 0 ? x : 0.0; }},
      {Op::LEAKY_RELU, kernel_LEAKY_RELU, -5, 5,
       [](double x) { return x > 0 ? x : double(0.1f * float(x)); }, 0.1f},
      {Op::GELU, kernel_GELU, -6, 6, gelu_tanh_ref},
      {Op::GELU_ERF, kernel_GELU_ERF, -6, 6, gelu_erf_ref},
      {Op::ERF, kernel_ERF, -5, 5, [](double x) { return std::erf(x); }},
      {Op::SILU, kernel_SILU, -20, 20, [](double x) { return x * sigmoid_ref(x); }},
      {Op::SIGMOID, kernel_SIGMOID, -30, 30, sigmoid_ref},
      {Op::TANH, kernel_TANH, -10, 10, [](double x) { return std::tanh(x); }},
      {Op::SOFTPLUS, kernel_SOFTPLUS, -30, 30, [](double x) { return std::log1p(std::exp(x)); }},
  };
}

// The parameters of the unary ops that have any, from a case's two numbers.
detail::OpParamBytes unary_params(Op op, float p0, float p1) {
  switch (op) {
    case Op::POW: return detail::pack_params(PowParams{p0});
    case Op::SCALE: return detail::pack_params(ScaleParams{p0, p1});
    case Op::CLAMP: return detail::pack_params(ClampParams{p0, p1});
    case Op::LEAKY_RELU: return detail::pack_params(LeakyReluParams{p0});
    default: return {};
  }
}

TEST(KernelsUnary, DenseStridedAndInPlaceMatchReference) {
  for (const UnCase& c : unary_cases()) {
    Nodes ns;
    const detail::OpParamBytes p = unary_params(c.op, c.p0, c.p1);
    TensorNode* xd = ns.make(f32, {301, 67});
    TensorNode* xt = ns.transposed(f32, {301, 67});
    fill_random(xd, c.lo, c.hi, 7);
    for (int64_t i = 0; i < xd->numel(); ++i) set(xt, i, at(xd, i));
    const std::vector<float> x = values(xd);
    TensorNode* dd = ns.op(c.op, f32, xd->shape, {xd}, p);
    TensorNode* dt = ns.op(c.op, f32, xd->shape, {xt}, p);
    run(c.k, dd, 2);
    run(c.k, dt, 3);
    for (int64_t i = 0; i < dd->numel(); ++i) {
      double want = c.ref(double(x[size_t(i)]));
      double tol = 1e-6 * std::max(1.0, std::fabs(want)) + 3e-7 * std::fabs(want);
      ASSERT_NEAR(at(dd, i), want, tol) << op_name(c.op) << " x=" << x[size_t(i)];
      ASSERT_NEAR(at(dt, i), at(dd, i), 2e-7 * std::max(1.0f, std::fabs(at(dd, i))))
          << op_name(c.op) << " strided x=" << x[size_t(i)];
    }
    // In place: dst is src0's memory.
    TensorNode* di = ns.op(c.op, f32, xd->shape, {xd}, p);
    di->data = xd->data;
    run(c.k, di, 2);
    for (int64_t i = 0; i < di->numel(); ++i) ASSERT_EQ(at(di, i), at(dd, i)) << op_name(c.op);
  }
}

TEST(KernelsUnary, NaNPropagatesThroughClampRelu) {
  using namespace cpu;
  for (Kernel k : {kernel_CLAMP, kernel_RELU, kernel_EXP, kernel_TANH, kernel_GELU_ERF}) {
    Nodes ns;
    TensorNode* x = ns.make(f32, {3});
    set(x, 0, kNaN), set(x, 1, 1), set(x, 2, -1);
    TensorNode* d = ns.op(Op::CLAMP, f32, {3}, {x}, ClampParams{-0.5f, 0.5f});
    run(k, d, 1);
    EXPECT_TRUE(std::isnan(at(d, 0)));
  }
  // sign is the exception: torch.sign(NaN) is 0 ((0 < x) - (x < 0)).
  Nodes ns;
  TensorNode* x = ns.make(f32, {3});
  set(x, 0, kNaN), set(x, 1, 1), set(x, 2, -1);
  TensorNode* d = ns.op(Op::SIGN, f32, {3}, {x});
  run(kernel_SIGN, d, 1);
  EXPECT_EQ(at(d, 0), 0.0f);
  EXPECT_EQ(at(d, 1), 1.0f);
  EXPECT_EQ(at(d, 2), -1.0f);
}

// ---------------------------------------------------------------- copies
TEST(KernelsCopy, HalfAndBfloatMatchScalarConversionsBitForBit) {
  std::vector<float> v = {0.0f,           -0.0f,          1.0f,        -2.5f,   65504.0f,
                          65520.0f,       1e6f,           -1e6f,       6.1e-5f, 5.96e-8f,
                          2.98e-8f,       1e-10f,         kInf,        -kInf,   3.14159f,
                          1.00048828125f, 1.00146484375f, 0.33333334f, 1e-40f,  3.4e38f};
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-70000, 70000);
  while (v.size() < 1037) v.push_back(v.size() % 2 ? u(rng) : u(rng) * 1e-6f);
  const int64_t n = int64_t(v.size());
  for (DType h : {f16, bf16}) {
    Nodes ns;
    TensorNode* x = ns.make(f32, {n});
    for (int64_t i = 0; i < n; ++i) set(x, i, v[size_t(i)]);
    TensorNode* y = ns.op(Op::COPY, h, {n}, {x});
    run(cpu::kernel_COPY, y, 2);
    TensorNode* z = ns.op(Op::COPY, f32, {n}, {y});
    run(cpu::kernel_COPY, z, 2);
    const uint16_t* bits = (const uint16_t*)y->data;
    for (int64_t i = 0; i < n; ++i) {
      uint16_t want = h == f16 ? f32_to_f16(v[size_t(i)]) : f32_to_bf16(v[size_t(i)]);
      ASSERT_EQ(bits[i], want) << dtype_name(h) << " x=" << v[size_t(i)];
      float back = h == f16 ? f16_to_f32(want) : bf16_to_f32(want);
      ASSERT_TRUE(same_bits(at(z, i), back)) << dtype_name(h) << " x=" << v[size_t(i)];
    }
    // NaN stays NaN both ways.
    set(x, 0, kNaN);
    run(cpu::kernel_COPY, y, 1);
    run(cpu::kernel_COPY, z, 1);
    EXPECT_TRUE(std::isnan(at(z, 0)));
  }
}

TEST(KernelsCopy, IntFloatConversions) {
  Nodes ns;
  const float fv[] = {3.7f, -3.7f, 0.0f, 16777216.0f, 1e10f, -1e10f, kNaN, 2147483520.0f};
  const int32_t iv[] = {3, -3, 0, 16777216, INT32_MAX, INT32_MIN, 0, 2147483520};
  TensorNode* x = ns.make(f32, {8});
  for (int i = 0; i < 8; ++i) set(x, i, fv[i]);
  TensorNode* y = ns.op(Op::COPY, i32, {8}, {x});
  run(cpu::kernel_COPY, y, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(((int32_t*)y->data)[i], iv[i]) << fv[i];
  TensorNode* z = ns.op(Op::COPY, f32, {8}, {y});
  run(cpu::kernel_COPY, z, 1);
  for (int i = 0; i < 8; ++i) EXPECT_EQ(at(z, i), float(iv[i]));
}

TEST(KernelsCopy, StridedSourcesAnyDtype) {
  for (DType dt : {f32, f16, bf16}) {
    Nodes ns;
    TensorNode* base = ns.make(f32, {5, 6, 7, 8});
    fill_random(base, -10, 10, 11);
    // permute (2, 0, 3, 1) of base: shape [7, 5, 8, 6].
    Strides bs = base->stride;
    TensorNode* v = ns.view(base, {7, 5, 8, 6}, {bs[2], bs[0], bs[3], bs[1]});
    TensorNode* d = ns.op(Op::COPY, dt, v->shape, {v});
    for (int nth : {1, 2}) {
      run(cpu::kernel_COPY, d, nth);
      for (int64_t i = 0; i < d->numel(); ++i) {
        float x = at(v, i);
        float want = dt == f32   ? x
                     : dt == f16 ? f16_to_f32(f32_to_f16(x))
                                 : bf16_to_f32(f32_to_bf16(x));
        ASSERT_EQ(at(d, i), want) << dtype_name(dt) << " " << i;
      }
    }
  }
  // A copy into a differently shaped contiguous dst (copy-then-reshape).
  Nodes ns;
  TensorNode* t = ns.transposed(f32, {30, 20});
  fill_random(t, -1, 1, 12);
  TensorNode* d = ns.op(Op::COPY, f32, {600}, {t});
  run(cpu::kernel_COPY, d, 2);
  for (int64_t i = 0; i < 600; ++i) ASSERT_EQ(at(d, i), at(t, i));
}

TEST(KernelsCopy, FillRandMaskAccumulate) {
  Nodes ns;
  TensorNode* f = ns.op(Op::FULL, f32, {100003}, {}, FillParams{2.5f});
  run(cpu::kernel_FULL, f, 2);
  for (int64_t i = 0; i < f->numel(); ++i) ASSERT_EQ(at(f, i), 2.5f);
  TensorNode* fi = ns.op(Op::FULL, i32, {33}, {}, FillParams{7.9f});
  run(cpu::kernel_FULL, fi, 2);
  for (int64_t i = 0; i < 33; ++i) ASSERT_EQ(((int32_t*)fi->data)[i], 7);

  TensorNode* seed = ns.make(i32, {1});
  ((int32_t*)seed->data)[0] = -5;
  TensorNode* m = ns.op(Op::RAND_MASK, f32, {50000}, {seed}, RandMaskParams{1234, 0.3f});
  run(cpu::kernel_RAND_MASK, m, 2);
  const uint64_t s = uint64_t(1234) ^ uint64_t(int64_t(-5));
  int64_t ones = 0;
  for (int64_t i = 0; i < m->numel(); ++i) {
    ASSERT_EQ(at(m, i), detail::rng_uniform(s, uint64_t(i)) < 0.3f ? 1.0f : 0.0f);
    ones += at(m, i) == 1.0f;
  }
  EXPECT_NEAR(double(ones) / 50000, 0.3, 0.02);

  TensorNode* acc = ns.make(f32, {200, 30});
  TensorNode* g = ns.make(f32, {30});
  fill_random(acc, -1, 1, 13);
  fill_random(g, -1, 1, 14);
  std::vector<float> before = values(acc);
  TensorNode* d = ns.op(Op::ACCUMULATE, f32, acc->shape, {acc, g});
  d->data = acc->data;
  run(cpu::kernel_ACCUMULATE, d, 2);
  for (int64_t i = 0; i < acc->numel(); ++i)
    ASSERT_EQ(at(acc, i), before[size_t(i)] + at(g, i % 30));
}

}  // namespace
}  // namespace kiln::kernel_test
