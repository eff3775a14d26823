// Reference: elementwise unary ops.
#include <cmath>
#include <functional>
#include <numbers>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

RefValue unary(const RefArgs& a, const std::function<double(double)>& f) {
  const RefValue& x = a.in(0);
  RefValue r = ref_out(a.node, x.shape);
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = f(x.v[k]);
  return r;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

RefValue ref_NEG(const RefArgs& a) {
  return unary(a, [](double x) { return -x; });
}
RefValue ref_ABS(const RefArgs& a) {
  return unary(a, [](double x) { return std::fabs(x); });
}
RefValue ref_SIGN(const RefArgs& a) {
  return unary(a, [](double x) { return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0; });
}
RefValue ref_SQR(const RefArgs& a) {
  return unary(a, [](double x) { return x * x; });
}
RefValue ref_SQRT(const RefArgs& a) {
  return unary(a, [](double x) { return std::sqrt(x); });
}
RefValue ref_RSQRT(const RefArgs& a) {
  return unary(a, [](double x) { return 1.0 / std::sqrt(x); });
}
RefValue ref_EXP(const RefArgs& a) {
  return unary(a, [](double x) { return std::exp(x); });
}
RefValue ref_LOG(const RefArgs& a) {
  return unary(a, [](double x) { return std::log(x); });
}
RefValue ref_SIN(const RefArgs& a) {
  return unary(a, [](double x) { return std::sin(x); });
}
RefValue ref_COS(const RefArgs& a) {
  return unary(a, [](double x) { return std::cos(x); });
}

RefValue ref_POW(const RefArgs& a) {
  const double e = a.params<PowParams>().exponent;
  return unary(a, [e](double x) { return std::pow(x, e); });
}

RefValue ref_SCALE(const RefArgs& a) {
  const ScaleParams p = a.params<ScaleParams>();
  const double s = p.mul, b = p.add;
  return unary(a, [s, b](double x) { return s * x + b; });
}

RefValue ref_CLAMP(const RefArgs& a) {
  const ClampParams p = a.params<ClampParams>();
  const double lo = p.lo, hi = p.hi;
  return unary(a, [lo, hi](double x) { return std::min(std::max(x, lo), hi); });
}

RefValue ref_RELU(const RefArgs& a) {
  return unary(a, [](double x) { return x > 0 ? x : 0.0; });
}

RefValue ref_LEAKY_RELU(const RefArgs& a) {
  const double slope = a.params<LeakyReluParams>().slope;
  return unary(a, [slope](double x) { return x > 0 ? x : slope * x; });
}

RefValue ref_GELU(const RefArgs& a) {
  return unary(a, [](double x) {
    const double c = std::sqrt(2.0 / std::numbers::pi);
    return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
  });
}

RefValue ref_GELU_ERF(const RefArgs& a) {
  return unary(a, [](double x) { return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2)); });
}

namespace {

// dy * f'(x) for the fused gradients: src0 dy, src1 x of one shape.
RefValue unary_back(const RefArgs& a, const std::function<double(double)>& df) {
  const RefValue& dy = a.in(0);
  const RefValue& x = a.in(1);
  RefValue r = ref_out(a.node, x.shape);
  ref_check_shape(a.node, dy.shape);
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = dy.v[k] * df(x.v[k]);
  return r;
}

}  // namespace

RefValue ref_GELU_BACK(const RefArgs& a) {
  return unary_back(a, [](double x) {
    const double c = std::sqrt(2.0 / std::numbers::pi), k = 0.044715;
    const double t = std::tanh(c * (x + k * x * x * x));
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * c * (1.0 + 3.0 * k * x * x);
  });
}

RefValue ref_GELU_ERF_BACK(const RefArgs& a) {
  return unary_back(a, [](double x) {
    const double cdf = 0.5 * (1.0 + std::erf(x / std::numbers::sqrt2));
    return cdf + x * std::exp(-0.5 * x * x) / std::sqrt(2.0 * std::numbers::pi);
  });
}

RefValue ref_ERF(const RefArgs& a) {
  return unary(a, [](double x) { return std::erf(x); });
}
RefValue ref_SILU(const RefArgs& a) {
  return unary(a, [](double x) { return x * sigmoid(x); });
}
RefValue ref_SIGMOID(const RefArgs& a) { return unary(a, sigmoid); }
RefValue ref_TANH(const RefArgs& a) {
  return unary(a, [](double x) { return std::tanh(x); });
}

// log(1 + exp(x)), written so that large |x| neither overflows nor loses digits.
RefValue ref_SOFTPLUS(const RefArgs& a) {
  return unary(a, [](double x) { return std::max(x, 0.0) + std::log1p(std::exp(-std::fabs(x))); });
}

}  // namespace kiln::test
