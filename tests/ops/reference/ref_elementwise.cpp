// Reference: elementwise binary (numpy broadcasting), compare, where, unary.
#include <cmath>
#include <functional>
#include <numbers>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

// out[idx] = f(a[bcast idx], b[bcast idx]) over the broadcast shape.
RefValue binary(const RefArgs& a, const std::function<double(double, double)>& f) {
  const RefValue& x = a.in(0);
  const RefValue& y = a.in(1);
  const Shape s = ref_bcast_shape(a.node, x.shape, y.shape);
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    const double v = f(ref_bcast_at(x, it.i, s.ndim()), ref_bcast_at(y, it.i, s.ndim()));
    r.v[size_t(ref_linear(s, it.i))] = ref_round_to(a.node->dtype, v);
  } while (it.next());
  return r;
}

RefValue unary(const RefArgs& a, const std::function<double(double)>& f) {
  const RefValue& x = a.in(0);
  RefValue r = ref_out(a.node, x.shape);
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = f(x.v[k]);
  return r;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

RefValue ref_ADD(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x + y; });
}
RefValue ref_SUB(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x - y; });
}
RefValue ref_MUL(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x * y; });
}
RefValue ref_DIV(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x / y; });
}

// CMP: i[0] 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge; result 1/0.
RefValue ref_CMP(const RefArgs& a) {
  const int64_t code = int64_t(a.params<CompareParams>().mode);
  if (code < 0 || code > 5) ref_fail(a.node, "bad comparison code " + std::to_string(code));
  return binary(a, [code](double x, double y) {
    bool r = false;
    switch (code) {
      case 0: r = x == y; break;
      case 1: r = x != y; break;
      case 2: r = x < y; break;
      case 3: r = x <= y; break;
      case 4: r = x > y; break;
      case 5: r = x >= y; break;
    }
    return r ? 1.0 : 0.0;
  });
}

// WHERE: cond != 0 ? a : b, all three broadcast.
RefValue ref_WHERE(const RefArgs& a) {
  const RefValue& c = a.in(0);
  const RefValue& x = a.in(1);
  const RefValue& y = a.in(2);
  const Shape s = ref_bcast_shape(a.node, ref_bcast_shape(a.node, c.shape, x.shape), y.shape);
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    const int nd = s.ndim();
    const double v =
        ref_bcast_at(c, it.i, nd) != 0.0 ? ref_bcast_at(x, it.i, nd) : ref_bcast_at(y, it.i, nd);
    r.v[size_t(ref_linear(s, it.i))] = v;
  } while (it.next());
  return r;
}

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
