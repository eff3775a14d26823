// vec_math accuracy against long-double libm over sweeps of float bit
// patterns (every 1031st float of each range, both signs), vector and scalar
// forms, plus special values (inf, NaN, zero, denormals).
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/vec_math.h"

namespace vm = kiln::cpu::vm;

namespace {

const float kVecNaN = std::numeric_limits<float>::quiet_NaN();
const float kInf = std::numeric_limits<float>::infinity();

float float_of_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Largest relative error of fn (vector form, lanes of kW; and scalar form) vs
// ref over floats in [lo, hi]; outputs below `floor` in magnitude are judged by
// absolute error against floor (denormal outputs, zeros of sin).
template <class Fn, class Ref>
double max_rel_err(Fn fn, Ref ref, float lo, float hi, double floor = FLT_MIN) {
  double worst = 0;
  float buf[vm::kW], out[vm::kW];
  int k = 0;
  auto flush = [&](int n) {
    vm::store(out, fn(vm::loadv<vm::VF>(buf, n)), n);
    for (int i = 0; i < n; ++i) {
      long double r = ref((long double)buf[i]);
      if (std::fabs((double)r) > FLT_MAX) continue;  // overflows in float
      const float s = fn(vm::SF{buf[i]}).v;
      for (float got : {out[i], s}) {
        double e = double(std::fabs((long double)got - r)) / std::max(double(std::fabs(r)), floor);
        if (!(e <= worst)) worst = e;  // NaN counts as worst
      }
    }
  };
  for (float sign : {1.0f, -1.0f})
    for (uint32_t u = 0; u < 0x7f800000u; u += 1031) {
      float x = sign * float_of_bits(u);
      if (x < lo || x > hi) continue;
      buf[k++] = x;
      if (k == vm::kW) flush(k), k = 0;
    }
  if (k) flush(k);
  return worst;
}

#define SWEEP(name, expr, refexpr, lo, hi, ...)                                           \
  max_rel_err([](auto x) { return expr; }, [](long double x) { return refexpr; }, lo, hi, \
              ##__VA_ARGS__)

TEST(VecMath, ExpLogAccuracy) {
  EXPECT_LT(SWEEP(exp, vm::exp(x), expl(x), -104.0f, 89.0f), 2e-7);
  EXPECT_LT(SWEEP(log, vm::log(x), logl(x), 0.0f, FLT_MAX), 2e-7);
  EXPECT_LT(SWEEP(log1p, vm::log1p(x), log1pl(x), -0.999f, FLT_MAX), 3e-7);
}

TEST(VecMath, TanhSigmoidSoftplusAccuracy) {
  EXPECT_LT(SWEEP(tanh, vm::tanh(x), tanhl(x), -100.0f, 100.0f), 3e-7);
  EXPECT_LT(SWEEP(sigmoid, vm::sigmoid(x), 1 / (1 + expl(-x)), -110.0f, 110.0f), 3e-7);
  EXPECT_LT(SWEEP(silu, vm::silu(x), x / (1 + expl(-x)), -80.0f, 80.0f), 3e-7);
  EXPECT_LT(SWEEP(softplus, vm::softplus(x), log1pl(expl(x)), -100.0f, 100.0f), 3e-7);
}

TEST(VecMath, ErfErfcGeluAccuracy) {
  EXPECT_LT(SWEEP(erf, vm::erf(x), erfl(x), -20.0f, 20.0f), 3e-7);
  EXPECT_LT(SWEEP(erfc, vm::erfc(x), erfcl(x), -20.0f, 9.2f), 8e-7);
  // gelu: < 4e-7 for x >= -1; below, the input's rounding dominates (~2.5e-7 x^2).
  auto gelu_erf_ref = [](long double x) { return 0.5L * x * erfcl(-x / sqrtl(2.0L)); };
  auto gelu_tanh_ref = [](long double x) {
    return x / (1 + expl(-1.5957691216057308L * (x + 0.044715L * x * x * x)));
  };
  auto ge = [](auto x) { return vm::gelu_erf(x); };
  auto gt = [](auto x) { return vm::gelu_tanh(x); };
  EXPECT_LT(max_rel_err(ge, gelu_erf_ref, -1.0f, 20.0f), 4e-7);
  EXPECT_LT(max_rel_err(gt, gelu_tanh_ref, -1.0f, 20.0f), 4e-7);
  EXPECT_LT(max_rel_err(ge, gelu_erf_ref, -3.0f, -1.0f), 1.2e-6);
  EXPECT_LT(max_rel_err(gt, gelu_tanh_ref, -3.0f, -1.0f), 1.2e-6);
  EXPECT_LT(max_rel_err(ge, gelu_erf_ref, -12.0f, -3.0f), 2.5e-5);
  EXPECT_LT(max_rel_err(gt, gelu_tanh_ref, -12.0f, -3.0f), 2.5e-5);
}

// GELU's derivatives (the fused GELU_BACK / GELU_ERF_BACK kernels): absolute
// error (they lie in [-0.17, 1.13]); huge |x| gives exactly 0 or 1, never NaN.
TEST(VecMath, GeluGradAbsoluteError) {
  auto erf_grad_ref = [](long double x) {
    return 0.5L * erfcl(-x / sqrtl(2.0L)) + x * expl(-0.5L * x * x) / sqrtl(2.0L * M_PIl);
  };
  auto tanh_grad_ref = [](long double x) {
    const long double c = sqrtl(2.0L / M_PIl), k = 0.044715L;
    const long double t = tanhl(c * (x + k * x * x * x));
    return 0.5L * (1 + t) + 0.5L * x * (1 - t * t) * c * (1 + 3 * k * x * x);
  };
  auto ge = [](auto x) { return vm::gelu_erf_grad(x); };
  auto gt = [](auto x) { return vm::gelu_tanh_grad(x); };
  EXPECT_LT(max_rel_err(ge, erf_grad_ref, -30.0f, 30.0f, 1.0), 4e-7);
  EXPECT_LT(max_rel_err(gt, tanh_grad_ref, -30.0f, 30.0f, 1.0), 4e-7);
  for (float x : {1e30f, kInf, 1e8f}) {
    EXPECT_EQ(vm::gelu_erf_grad(x), 1.0f) << x;
    EXPECT_EQ(vm::gelu_tanh_grad(x), 1.0f) << x;
    EXPECT_EQ(vm::gelu_tanh_grad(-x), 0.0f) << -x;
  }
  EXPECT_EQ(vm::gelu_erf_grad(-1e8f), 0.0f);
  EXPECT_TRUE(std::isnan(vm::gelu_erf_grad(kVecNaN)));
  EXPECT_TRUE(std::isnan(vm::gelu_tanh_grad(kVecNaN)));
}

TEST(VecMath, SinCosAbsoluteError) {
  EXPECT_LT(SWEEP(sin, vm::sin(x), sinl(x), -1e4f, 1e4f, 1.0), 2e-7);
  EXPECT_LT(SWEEP(cos, vm::cos(x), cosl(x), -1e4f, 1e4f, 1.0), 2e-7);
  EXPECT_LT(SWEEP(sin, vm::sin(x), sinl(x), -1e30f, 1e30f, 1.0), 2e-7);  // libm fallback lanes
  EXPECT_LT(SWEEP(sin, vm::sin(x), sinl(x), -1.5f, 1.5f), 2e-7);         // relative near 0
}

TEST(VecMath, SpecialValues) {
  EXPECT_TRUE(std::isnan(vm::exp(kVecNaN)));
  EXPECT_EQ(vm::exp(kInf), kInf);
  EXPECT_EQ(vm::exp(-kInf), 0.0f);
  EXPECT_EQ(vm::exp(0.0f), 1.0f);
  EXPECT_EQ(vm::exp(-103.0f), float(expl(-103.0L)));  // denormal result
  EXPECT_TRUE(std::isnan(vm::log(-1.0f)));
  EXPECT_TRUE(std::isnan(vm::log(kVecNaN)));
  EXPECT_EQ(vm::log(0.0f), -kInf);
  EXPECT_EQ(vm::log(kInf), kInf);
  EXPECT_EQ(vm::log(1.0f), 0.0f);
  EXPECT_NEAR(vm::log(1e-45f), logl((long double)1e-45f), 1e-5);  // denormal input
  EXPECT_EQ(vm::tanh(kInf), 1.0f);
  EXPECT_EQ(vm::tanh(-kInf), -1.0f);
  EXPECT_TRUE(std::isnan(vm::tanh(kVecNaN)));
  EXPECT_EQ(vm::sigmoid(-kInf), 0.0f);
  EXPECT_EQ(vm::sigmoid(kInf), 1.0f);
  EXPECT_EQ(vm::erf(kInf), 1.0f);
  EXPECT_EQ(vm::erf(-kInf), -1.0f);
  EXPECT_TRUE(std::isnan(vm::erf(kVecNaN)));
  EXPECT_EQ(vm::erfc(kInf), 0.0f);
  EXPECT_EQ(vm::erfc(-kInf), 2.0f);
  EXPECT_EQ(vm::softplus(kInf), kInf);
  EXPECT_EQ(vm::softplus(-kInf), 0.0f);
  EXPECT_EQ(vm::softplus(100.0f), 100.0f);
  EXPECT_TRUE(std::isnan(vm::sin(kInf)));
  EXPECT_TRUE(std::isnan(vm::cos(kVecNaN)));
  EXPECT_EQ(vm::gelu_erf(0.0f), 0.0f);
  EXPECT_EQ(vm::gelu_tanh(50.0f), 50.0f);
}

}  // namespace
