// Softmax builders: softmax / log_softmax (SOFTMAX, LOG_SOFTMAX) and their
// backward rules.
//
// Semantics decisions (PyTorch unless noted):
// - softmax/log_softmax work over the last axis of f32 x (ndim >= 1). The optional
//   additive mask is f32 and must broadcast TO x's shape (it never enlarges the
//   result). `causal` follows ops.def: with R rows (dim -2, R = 1 for 1-D x) and C
//   columns, column c is masked in row r when c > r + (C - R) (bottom-right
//   aligned, as in KV-cached attention). Rows with every entry masked give 0
//   (softmax) and -inf (log_softmax) instead of NaN.
#include <cmath>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

Tensor softmax_like(Op op, const char* name, Tensor x, const SoftmaxOptions& opt) {
  detail::check_defined(name, {x});
  detail::check_float32(name, "x", x);
  if (x.ndim() < 1) fail(name, "x must have at least 1 dimension, got a scalar ", x.shape().str());
  if (!std::isfinite(opt.scale)) fail(name, "scale must be finite, got ", opt.scale);
  if (opt.mask.defined()) {
    detail::check_same_ctx(name, {x, opt.mask});
    detail::check_float32(name, "mask", opt.mask);
    const Shape& ms = opt.mask.shape();
    bool ok = ms.ndim() <= x.ndim();
    for (int i = 0; ok && i < ms.ndim(); ++i) {
      const int64_t md = ms[ms.ndim() - 1 - i], xd = x.shape()[x.ndim() - 1 - i];
      ok = md == xd || md == 1;
    }
    if (!ok) fail(name, "mask ", ms.str(), " cannot be broadcast to x ", x.shape().str());
  }
  return Tensor(detail::new_op(op, f32, x.shape(), {x.node(), opt.mask.node()},
                               SoftmaxParams{opt.scale, opt.causal}));
}

}  // namespace

Tensor softmax(Tensor x, const SoftmaxOptions& opt) {
  return softmax_like(Op::SOFTMAX, "softmax", x, opt);
}

Tensor log_softmax(Tensor x, const SoftmaxOptions& opt) {
  return softmax_like(Op::LOG_SOFTMAX, "log_softmax", x, opt);
}

namespace detail {

// y = softmax(v), v = scale*x + mask: dv = y * (g - sum(g*y)); dx = scale*dv.
namespace {
// 1 where the causal rule keeps an entry of the last two dims of x, 0 where it
// masks one: softmax of zeros is 1/kept > 0 exactly at the kept entries.
Tensor causal_keep(Tensor x) {
  const int64_t R = x.size(-2), C = x.size(-1);
  SoftmaxOptions o;
  o.causal = true;
  return gt(softmax(zeros(x.ctx(), Shape{R, C}), o), 0.0f);
}
}  // namespace

// y = softmax(v): masked entries (causal or -inf) have y = 0, so dv = 0 there.
void backward_SOFTMAX(GradCtx& g) {
  Tensor y = g.out(), gy = g.grad();
  Tensor dv = mul(y, sub(gy, sum(mul(gy, y), -1, true)));
  const float s = g.params<Op::SOFTMAX>().scale;
  if (g.needs(0)) g.add(0, s == 1.0f ? dv : scale(dv, s));
  if (g.out().node()->n_src > 1 && g.needs(1)) g.add(1, sum_to(dv, g.src(1).shape()));
}

// y = v - logsumexp(v): dv = g - exp(y) * sum(g); dx = scale*dv. The sum runs
// over the whole row, masked entries included (as PyTorch's log_softmax backward).
// Causal: PyTorch masks with masked_fill(-inf), whose backward gives the masked
// entries no gradient; dv there is g (exp(-inf) = 0), so it is zeroed here. An
// additive -inf mask passes the gradient through, as PyTorch's x + mask does.
void backward_LOG_SOFTMAX(GradCtx& g) {
  Tensor y = g.out(), gy = g.grad();
  Tensor dv = sub(gy, mul(exp(y), sum(gy, -1, true)));
  const SoftmaxParams p = g.params<Op::LOG_SOFTMAX>();
  const float s = p.scale;
  if (p.causal && y.ndim() >= 2) dv = where(causal_keep(y), dv, zeros(y.ctx(), Shape{}));
  if (g.needs(0)) g.add(0, s == 1.0f ? dv : scale(dv, s));
  if (g.out().node()->n_src > 1 && g.needs(1)) g.add(1, sum_to(dv, g.src(1).shape()));
}

}  // namespace detail

}  // namespace kiln
