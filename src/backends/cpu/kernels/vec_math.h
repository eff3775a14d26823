// SIMD float math for the CPU kernels: exp, log, log1p, tanh, sigmoid, erf,
// erfc, sin, cos and the activations built on them (silu, softplus, gelu).
//
// The vector types (VF, SF, ...) are in simd.h. Every function below is a
// template over V in {VF, SF}; plain-float overloads (vm::exp(float) ...) are
// provided for convenience.
//
// Accuracy (measured against long-double libm over dense sweeps, see
// tests/cpu/test_vec_math.cpp), relative error unless noted:
//   exp      < 2e-7 for all finite x; overflow to +inf above 88.72, exact
//            denormal results down to 2^-149, 0 below -104; NaN -> NaN.
//   log      < 2e-7 for all x > 0 incl. denormals; log(0) = -inf,
//            log(x<0) = NaN, log(inf) = inf, NaN -> NaN.
//   log1p    < 3e-7 for x > -1.
//   tanh     < 3e-7; sigmoid, silu, softplus < 3e-7 (sigmoid also in the far
//            negative tail, down to denormal results).
//   erf      < 3e-7; erfc < 8e-7 for x < 9.2 (also in the tail where erf
//            rounds to +-1, which keeps gelu_erf accurate for x < 0).
//   gelu_erf, gelu_tanh: < 4e-7 relative for x >= -1; below, the rounding of
//            the input dominates (relative error ~2.5e-7 x^2, as in any float
//            implementation: 1e-6 at x = -2, 2.5e-5 at x = -10).
//   gelu_erf_grad, gelu_tanh_grad (the derivatives): absolute error < 4e-7
//            (tests/cpu/test_vec_math.cpp); the same input rounding applies.
//   sin/cos  absolute error < 2e-7 for |x| <= 1e4 (Cody-Waite reduction by
//            pi/2); larger |x|, inf and NaN lanes fall back to std::sin/cos.
// The vector and scalar forms run the same operation sequence; they may still
// differ in the last bit where the compiler contracts a*b+c differently, so a
// kernel that must be reproducible uses one form per element consistently.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>

#include "backends/cpu/kernels/simd.h"

namespace kiln::cpu::vm {

// ---------------------------------------------------------------- exp
// x = n ln2 + r, |r| <= ln2/2 (two-part ln2), e^r by its degree-7 Taylor
// polynomial (truncation error < 6e-9), times 2^n (AVX-512: vscalefps; else
// built in the exponent bits, in two steps when 2^n is not a normal float, so
// denormal results and overflow come out right either way).
template <Vec V>
inline V exp(V x) {
  using I = typename V::I;
  V xc = min(max(x, c<V>(-104.0f)), c<V>(89.0f));
  V n = round_even(xc * c<V>(1.44269504088896341f));
  V r = madd(n, c<V>(-0.693145751953125f), xc);
  r = madd(n, c<V>(-1.428606765330187045e-06f), r);
  V p = c<V>(1.0f / 5040);
  p = madd(p, r, c<V>(1.0f / 720));
  p = madd(p, r, c<V>(1.0f / 120));
  p = madd(p, r, c<V>(1.0f / 24));
  p = madd(p, r, c<V>(1.0f / 6));
  p = madd(p, r, c<V>(0.5f));
  p = madd(p, r * r, r) + c<V>(1.0f);
  V res;
#if defined(KILN_VM_HAVE_SCALE2)
  if constexpr (std::is_same_v<V, VF>) {
    res = scale2(p, n);
  } else
#endif
  {
    I ni = to_int(n);
    if (!any((n < c<V>(-126.0f)) | (n > c<V>(127.0f)))) {
      res = p * as_float(shl<23>(ni + ci<V>(127)));
    } else {  // 2^n is not a normal float: scale in two exact steps, round once
      I n1 = sra<1>(ni);
      I n2 = ni - n1;
      res = p * as_float(shl<23>(n1 + ci<V>(127))) * as_float(shl<23>(n2 + ci<V>(127)));
    }
  }
  return select(isnan(x), x, res);
}

// ---------------------------------------------------------------- log
// x = 2^e m with m in [sqrt(1/2), sqrt(2)); log m = 2 atanh(s), s = (m-1)/(m+1),
// |s| <= 0.172, by the odd series through s^9 (truncation error < 3e-9).
template <Vec V>
inline V log(V x) {
  using I = typename V::I;
  typename V::M tiny = x < c<V>(1.17549435e-38f);  // denormals (and <= 0, fixed below)
  V xs = select(tiny, x * c<V>(8388608.0f), x);
  V eadj = select(tiny, c<V>(23.0f), c<V>(0.0f));
  I bits = as_int(xs);
  V e = to_float(shr<23>(bits) - ci<V>(127)) - eadj;
  V m = as_float((bits & ci<V>(0x007fffff)) | ci<V>(0x3f800000));
  typename V::M big = m > c<V>(1.41421356f);
  m = select(big, m * c<V>(0.5f), m);
  e = select(big, e + c<V>(1.0f), e);
  V s = (m - c<V>(1.0f)) / (m + c<V>(1.0f));
  V z = s * s;
  V q = c<V>(2.0f / 9);
  q = madd(q, z, c<V>(2.0f / 7));
  q = madd(q, z, c<V>(2.0f / 5));
  q = madd(q, z, c<V>(2.0f / 3));
  V lm = madd(s * z, q, s + s);
  V res = madd(e, c<V>(0.693145751953125f), madd(e, c<V>(1.428606765330187045e-06f), lm));
  const float inf = std::numeric_limits<float>::infinity();
  res = select(x == c<V>(inf), x, res);
  res = select(x == c<V>(0.0f), c<V>(-inf), res);
  res = select(x < c<V>(0.0f), c<V>(std::numeric_limits<float>::quiet_NaN()), res);
  return select(isnan(x), x, res);
}

// log(1 + x) for x > -1, accurate for small x: u = 1 + x rounds, and the
// first-order correction ((u - 1) - x) / u puts back what the rounding lost.
template <Vec V>
inline V log1p(V x) {
  V u = x + c<V>(1.0f);
  V corr = ((u - c<V>(1.0f)) - x) / u;
  V res = log(u) - corr;
  res = select(u == c<V>(1.0f), x, res);
  return select(u == c<V>(std::numeric_limits<float>::infinity()), u, res);
}

// ---------------------------------------------------------------- tanh, sigmoid
// |x| < 0.625: x + x^3 P(x^2) (minimax, error < 5e-9); otherwise
// sign(x) (1 - 2 / (e^{2|x|} + 1)).
template <Vec V>
inline V tanh(V x) {
  V a = abs(x);
  typename V::M small = a < c<V>(0.625f);
  V res_s = x, res_l;
  if (any(small)) {
    V z = x * x;
    V p = c<V>(-5.70498872745e-3f);
    p = madd(p, z, c<V>(2.06390887954e-2f));
    p = madd(p, z, c<V>(-5.37397155531e-2f));
    p = madd(p, z, c<V>(1.33314422036e-1f));
    p = madd(p, z, c<V>(-3.33332819422e-1f));
    res_s = madd(x * z, p, x);
    if (all(small)) return res_s;
  }
  V e = exp(a + a);
  res_l = copysign(c<V>(1.0f) - c<V>(2.0f) / (e + c<V>(1.0f)), x);
  return any(small) ? select(small, res_s, res_l) : res_l;
}

// 1 / (1 + e^-x), from e = e^{-|x|} so neither branch overflows and the
// negative tail keeps full relative precision.
template <Vec V>
inline V sigmoid(V x) {
  V e = exp(-abs(x));
  V s = c<V>(1.0f) / (c<V>(1.0f) + e);
  return select(x >= c<V>(0.0f), s, e * s);
}

template <Vec V>
inline V silu(V x) {
  return x * sigmoid(x);
}

// log(1 + e^x) = max(x, 0) + log1p(e^{-|x|}); exact for large |x|.
template <Vec V>
inline V softplus(V x) {
  V res = max(x, c<V>(0.0f)) + log1p(exp(-abs(x)));
  return select(isnan(x), x, res);
}

// ---------------------------------------------------------------- erf, erfc
// |x| < 0.875: x P(x^2) (minimax, error < 1e-8). Beyond: erfc(a) =
// e^{-a^2} R(1/a) with R a degree-10 minimax fit on a in [0.875, 10.2]
// (in 1/a - 0.62) (error
// < 6e-8); a^2 is split exactly (fma) so e^{-a^2} keeps full precision in the tail.
// The rounding error of hi = a*a (a*a = hi + lo exactly): one FMA, or Dekker's
// split where FMA is not fast.
template <Vec V>
inline V sqr_lo(V a, V hi) {
  if constexpr (std::is_same_v<V, SF> && !KILN_VM_FAST_FMA) {
    V t = a * c<V>(4097.0f);
    V ah = t - (t - a), al = a - ah;
    return ((ah * ah - hi) + c<V>(2.0f) * ah * al) + al * al;
  } else {
    return madd(a, a, -hi);
  }
}
template <Vec V>
inline V erf_small(V x) {
  V z = x * x;
  V p = c<V>(-6.203419663e-04f);
  p = madd(p, z, c<V>(5.032215816e-03f));
  p = madd(p, z, c<V>(-2.679148927e-02f));
  p = madd(p, z, c<V>(1.128245620e-01f));
  p = madd(p, z, c<V>(-3.761255058e-01f));
  p = madd(p, z, c<V>(1.128379158e+00f));
  return x * p;
}
// R(1/a) for a = min(10.5, |x|) (erfc is 0 in float beyond 10.5).
template <Vec V>
inline V erfc_large_r(V a) {
  V u = c<V>(1.0f) / a - c<V>(0.62044818f);  // centred: better conditioned
  V r = c<V>(-3.848280345e-02f);
  r = madd(r, u, c<V>(3.592303772e-02f));
  r = madd(r, u, c<V>(6.190769180e-03f));
  r = madd(r, u, c<V>(-3.040065479e-02f));
  r = madd(r, u, c<V>(4.353601306e-02f));
  r = madd(r, u, c<V>(-4.768785708e-02f));
  r = madd(r, u, c<V>(2.446197054e-02f));
  r = madd(r, u, c<V>(4.330998781e-02f));
  r = madd(r, u, c<V>(-1.729911329e-01f));
  r = madd(r, u, c<V>(3.838562021e-01f));
  r = madd(r, u, c<V>(3.042093382e-01f));
  return r;
}
// e^{-a^2} with a^2 = hi + lo split exactly, for a <= 10.5 (or NaN).
template <Vec V>
inline V exp_neg_sqr(V a) {
  V hi = a * a;
  V lo = sqr_lo(a, hi);
  V e = exp(-hi);
  return madd(-e, lo, e);
}
template <Vec V>
inline V erfc_large(V a) {  // a >= 0.875, +inf or NaN
  a = min(c<V>(10.5f), a);  // erfc is 0 in float beyond; keeps NaN, avoids inf*inf
  V r = erfc_large_r(a);
  return exp_neg_sqr(a) * r;
}
template <Vec V>
inline V erf(V x) {
  V a = abs(x);
  typename V::M small = a < c<V>(0.875f);
  V rs = erf_small(x);
  if (all(small)) return rs;
  V rl = copysign(c<V>(1.0f) - erfc_large(a), x);
  return select(small, rs, rl);
}
template <Vec V>
inline V erfc(V x) {
  V a = abs(x);
  typename V::M small = a < c<V>(0.875f);
  V rs = c<V>(1.0f) - erf_small(x);
  if (all(small)) return rs;
  V t = erfc_large(a);
  V rl = select(x > c<V>(0.0f), t, c<V>(2.0f) - t);
  return select(small, rs, rl);
}

// ---------------------------------------------------------------- gelu
// Exact form: x/2 * erfc(-x/sqrt2) (= x/2 (1 + erf(x/sqrt2)) without the
// cancellation for x << 0).
template <Vec V>
inline V gelu_erf(V x) {
  return c<V>(0.5f) * x * erfc(x * c<V>(-0.70710678118654752f));
}
// Tanh form: 0.5x(1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi)(x + 0.044715x^3).
template <Vec V>
inline V gelu_tanh(V x) {
  V u2 = c<V>(2.0f * 0.7978845608028654f) * madd(c<V>(0.044715f) * x * x, x, x);
  return x * sigmoid(u2);
}
// d/dx gelu_erf = Phi(x) + x phi(x), Phi(x) = erfc(z)/2 with z = -x/sqrt2 (no
// cancellation for x << 0), phi(x) = e^{-z^2} / sqrt(2 pi): one e^{-z^2} serves
// both (erfc's large branch is e^{-z^2} R(1/|z|)). Beyond |z| = 10.5 e^{-z^2} is 0
// in float, and so is x phi(x) (not inf * 0).
template <Vec V>
inline V gelu_erf_grad(V x) {
  const V z = x * c<V>(-0.70710678118654752f);
  const V a = min(c<V>(10.5f), abs(z));  // keeps NaN
  const V e = exp_neg_sqr(a);
  typename V::M small = a < c<V>(0.875f);
  V erfc_z = c<V>(1.0f) - erf_small(z);
  if (!all(small)) {
    const V t = e * erfc_large_r(a);
    erfc_z = select(small, erfc_z, select(z > c<V>(0.0f), t, c<V>(2.0f) - t));
  }
  const V cdf = c<V>(0.5f) * erfc_z;
  return select(e > c<V>(0.0f), madd(x * c<V>(0.3989422804014327f), e, cdf), cdf);
}
// d/dx x s, s = sigmoid(2u): s + x 2u' s (1 - s), u' = sqrt(2/pi)(1 + 3 0.044715 x^2).
// With e = e^{-|2u|}: s = 1/(1+e) (or e/(1+e) for u < 0) and s(1-s) = e/(1+e)^2
// for either sign, so no 1 - s cancels; where s(1-s) is 0 the second term is 0
// (not 0 * inf for huge |x|).
template <Vec V>
inline V gelu_tanh_grad(V x) {
  constexpr float k2c = 2.0f * 0.7978845608028654f;
  const V x2 = x * x;
  const V u2 = c<V>(k2c) * madd(c<V>(0.044715f) * x2, x, x);
  const V e = exp(-abs(u2));
  const V r = c<V>(1.0f) / (c<V>(1.0f) + e);
  const V s = select(u2 >= c<V>(0.0f), r, e * r);
  const V ds = e * r * r;
  const V du2 = c<V>(k2c) * madd(c<V>(3.0f * 0.044715f), x2, c<V>(1.0f));
  const V term = select(ds > c<V>(0.0f), x * du2 * ds, c<V>(0.0f));
  return s + term;
}

// ---------------------------------------------------------------- sin, cos
// x = j pi/2 + r (three-part pi/2, exact for |j| < 2^13 with FMA), then the
// Taylor polynomials of sin and cos on |r| <= pi/4 (error < 3e-9); the quadrant
// picks which and the sign. Lanes with |x| > 1e4, inf or NaN use std::sin/cos.
template <Vec V, bool kCos>
inline V sincos_impl(V x) {
  using I = typename V::I;
  V j = round_even(x * c<V>(0.63661977236758134f));
  V r = madd(j, c<V>(-1.5703125f), x);
  r = madd(j, c<V>(-4.837512969970703125e-4f), r);
  r = madd(j, c<V>(-7.54978995489188216e-8f), r);
  V z = r * r;
  V s = c<V>(1.0f / 362880);
  s = madd(s, z, c<V>(-1.0f / 5040));
  s = madd(s, z, c<V>(1.0f / 120));
  s = madd(s, z, c<V>(-1.0f / 6));
  s = madd(s * z, r, r);
  V k = c<V>(-1.0f / 3628800);
  k = madd(k, z, c<V>(1.0f / 40320));
  k = madd(k, z, c<V>(-1.0f / 720));
  k = madd(k, z, c<V>(1.0f / 24));
  k = madd(k, z, c<V>(-0.5f));
  k = madd(k, z, c<V>(1.0f));
  I q = to_int(j);
  if constexpr (kCos) q = q + ci<V>(1);
  typename V::M odd = (q & ci<V>(1)) == ci<V>(1);
  V res = select(odd, k, s);
  res = as_float(as_int(res) ^ shl<30>(q & ci<V>(2)));  // quadrants 2, 3 negate
  typename V::M wild = ~(abs(x) <= c<V>(1e4f));         // also inf and NaN
  if (any(wild)) {
    float xs[V::W], rs[V::W];
    store(xs, x);
    store(rs, res);
    for (int i = 0; i < V::W; ++i)
      if (!(std::fabs(xs[i]) <= 1e4f)) rs[i] = kCos ? std::cos(xs[i]) : std::sin(xs[i]);
    res = loadv<V>(rs);
  }
  return res;
}
template <Vec V>
inline V sin(V x) {
  return sincos_impl<V, false>(x);
}
template <Vec V>
inline V cos(V x) {
  return sincos_impl<V, true>(x);
}

// ---------------------------------------------------------------- scalar forms
inline float exp(float x) { return exp(SF{x}).v; }
inline float log(float x) { return log(SF{x}).v; }
inline float log1p(float x) { return log1p(SF{x}).v; }
inline float tanh(float x) { return tanh(SF{x}).v; }
inline float sigmoid(float x) { return sigmoid(SF{x}).v; }
inline float silu(float x) { return silu(SF{x}).v; }
inline float softplus(float x) { return softplus(SF{x}).v; }
inline float erf(float x) { return erf(SF{x}).v; }
inline float erfc(float x) { return erfc(SF{x}).v; }
inline float gelu_erf(float x) { return gelu_erf(SF{x}).v; }
inline float gelu_tanh(float x) { return gelu_tanh(SF{x}).v; }
inline float gelu_erf_grad(float x) { return gelu_erf_grad(SF{x}).v; }
inline float gelu_tanh_grad(float x) { return gelu_tanh_grad(SF{x}).v; }
inline float sin(float x) { return sin(SF{x}).v; }
inline float cos(float x) { return cos(SF{x}).v; }

}  // namespace kiln::cpu::vm
