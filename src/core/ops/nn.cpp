// Neural-net builders: softmax / log_softmax (primitives with backward rules),
// and the composites cross_entropy, mse_loss, one_hot, layer_norm, rms_norm,
// dropout (built from primitives, so they need no rules of their own).
//
// Semantics decisions (PyTorch unless noted):
// - softmax/log_softmax work over the last axis of f32 x (ndim >= 1). The optional
//   additive mask is f32 and must broadcast TO x's shape (it never enlarges the
//   result). `causal` follows ops.def: with R rows (dim -2, R = 1 for 1-D x) and C
//   columns, column c is masked in row r when c > r + (C - R) (bottom-right
//   aligned, as in KV-cached attention). Rows with every entry masked give 0
//   (softmax) and -inf (log_softmax) instead of NaN.
// - cross_entropy: logits f32 [N, C]; target either i32 class labels [N] or f32
//   probabilities [N, C] (PyTorch's "class probabilities" form). Reduction is the
//   mean over N. No ignore_index, no label smoothing, no class weights. Labels
//   out of [0, C) are reported at run time by the ONE_HOT kernel under the name
//   "cross_entropy".
// - mse_loss requires identical shapes (PyTorch only warns on broadcasting here,
//   since [N, 1] vs [N] is almost always a bug); mean over all elements.
// - one_hot: f32 result (not int64 as in PyTorch); `classes` must be given (> 0)
//   because graphs are data-free; labels rank <= 3.
// - layer_norm / rms_norm normalise the last axis only (normalized_shape = [D]);
//   biased variance as PyTorch; eps >= 0. layer_norm is one fused primitive
//   (LAYER_NORM); cross_entropy with i32 labels too (CROSS_ENTROPY).
// - dropout: p in [0, 1); identity when !training or p == 0. The mask depends only
//   on (seed ^ seed_tensor[0], element index), see kiln/ext/rng.h.
#include <cmath>
#include <utility>

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

Tensor one_hot(Tensor labels, int64_t classes) {
  detail::check_defined("one_hot", {labels});
  detail::check_dtype("one_hot", "labels", labels, i32);
  if (classes <= 0) fail("one_hot", "classes must be > 0, got ", classes);
  if (labels.ndim() >= kMaxDims)
    fail("one_hot", "labels ", labels.shape().str(), " have ", labels.ndim(),
         " dimensions; at most ", kMaxDims - 1, " are supported");
  Shape s = labels.shape();
  s.push_back(classes);
  return Tensor(detail::new_op(Op::ONE_HOT, f32, s, {labels.node()}, OneHotParams{classes, false}));
}

Tensor cross_entropy(Tensor logits, Tensor target) {
  const char* op = "cross_entropy";
  detail::check_defined(op, {logits, target});
  detail::check_same_ctx(op, {logits, target});
  detail::check_float32(op, "logits", logits);
  if (logits.ndim() != 2) fail(op, "logits must be [N, C], got ", logits.shape().str());
  const int64_t n = logits.shape()[0];
  Tensor probs;
  if (target.dtype() == i32) {
    if (target.ndim() != 1 || target.shape()[0] != n)
      fail(op, "labels are ", target.shape().str(), " but logits are ", logits.shape().str(),
           " (labels must be [", n, "])");
    // Fused: no one_hot and no [N, C] log-probabilities in the forward pass, and
    // a -inf non-target logit gives a finite loss (PyTorch's result).
    return Tensor(detail::new_op(Op::CROSS_ENTROPY, f32, Shape{}, {logits.node(), target.node()}));
  } else if (target.dtype() == f32) {
    if (!(target.shape() == logits.shape()))
      fail(op, "target probabilities are ", target.shape().str(), " but logits are ",
           logits.shape().str());
    probs = target;
  } else {
    fail(op, "target must be i32 labels [N] or f32 probabilities [N, C] but is ",
         dtype_name(target.dtype()), " ", target.shape().str());
  }
  // Probabilities: a 0 probability times a -inf log-probability is NaN, as in
  // PyTorch. (Labels returned above: the fused op adds only the label's term.)
  return scale(sum(mul(probs, log_softmax(logits))), -1.0f / float(n));
}

Tensor mse_loss(Tensor a, Tensor b) {
  detail::check_defined("mse_loss", {a, b});
  detail::check_same_ctx("mse_loss", {a, b});
  detail::check_float32("mse_loss", "a", a);
  detail::check_float32("mse_loss", "b", b);
  if (!(a.shape() == b.shape()))
    fail("mse_loss", "a is ", a.shape().str(), " but b is ", b.shape().str());
  return mean(sqr(sub(a, b)));
}

namespace {

// Checks an optional per-feature affine parameter of a norm over the last axis.
void check_affine(const char* op, const char* what, Tensor x, Tensor p) {
  if (!p.defined()) return;
  detail::check_same_ctx(op, {x, p});
  detail::check_float32(op, what, p);
  const int64_t d = x.shape()[x.ndim() - 1];
  if (p.ndim() != 1 || p.shape()[0] != d)
    fail(op, what, " is ", p.shape().str(), " but x is ", x.shape().str(), " (", what, " must be [",
         d, "])");
}

void check_norm_input(const char* op, Tensor x, float eps) {
  detail::check_defined(op, {x});
  detail::check_float32(op, "x", x);
  if (x.ndim() < 1) fail(op, "x must have at least 1 dimension, got a scalar ", x.shape().str());
  if (!(eps >= 0.0f) || !std::isfinite(eps)) fail(op, "eps must be finite and >= 0, got ", eps);
}

}  // namespace

Tensor layer_norm(Tensor x, Tensor weight, Tensor bias, float eps) {
  check_norm_input("layer_norm", x, eps);
  check_affine("layer_norm", "weight", x, weight);
  check_affine("layer_norm", "bias", x, bias);
  // One fused primitive (LAYER_NORM); its rule uses LAYER_NORM_BACK(_AFFINE).
  const LayerNormParams prm{eps, weight.defined(), bias.defined()};
  TensorNode* w = weight.node();
  TensorNode* b = bias.node();
  if (!w) std::swap(w, b);  // sources are packed: x, [weight], [bias]
  return Tensor(detail::new_op(Op::LAYER_NORM, f32, x.shape(), {x.node(), w, b}, prm));
}

Tensor rms_norm(Tensor x, Tensor weight, float eps) {
  check_norm_input("rms_norm", x, eps);
  check_affine("rms_norm", "weight", x, weight);
  Tensor ms = mean(sqr(x), -1, true);
  Tensor y = div(x, sqrt(scale(ms, 1.0f, eps)));
  if (weight.defined()) y = mul(y, weight);
  return y;
}

Tensor dropout(Tensor x, float p, uint64_t seed, bool training, Tensor seed_tensor) {
  detail::check_defined("dropout", {x});
  detail::check_float32("dropout", "x", x);
  if (!(p >= 0.0f && p < 1.0f)) fail("dropout", "p must be in [0, 1), got ", p);
  if (seed_tensor.defined()) {
    detail::check_same_ctx("dropout", {x, seed_tensor});
    detail::check_dtype("dropout", "seed_tensor", seed_tensor, i32);
    if (seed_tensor.numel() < 1)
      fail("dropout", "seed_tensor ", seed_tensor.shape().str(), " has no elements");
  }
  if (!training || p == 0.0f) return x;
  const RandMaskParams prm{int64_t(seed), 1.0f - p};
  TensorNode* m;
  if (seed_tensor.defined()) {
    m = detail::new_op(Op::RAND_MASK, f32, x.shape(), {seed_tensor.node()}, prm);
  } else {
    // new_op takes its context from a source; this node has none.
    m = x.ctx().new_node(f32, x.shape(), Op::RAND_MASK);
    detail::set_params(*m, prm);
  }
  return mul(x, scale(Tensor(m), 1.0f / (1.0f - p)));
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

// LAYER_NORM: dx by LAYER_NORM_BACK; d weight and d bias by one reduction over
// rows (LAYER_NORM_BACK_AFFINE, row 0 and row 1 of its [2, D] result).
void backward_LAYER_NORM(GradCtx& g) {
  const LayerNormParams prm = g.params<Op::LAYER_NORM>();
  Tensor x = g.src(0), dy = g.grad();
  const int iw = prm.has_weight ? 1 : -1, ib = prm.has_bias ? (prm.has_weight ? 2 : 1) : -1;
  if (g.needs(0)) {
    TensorNode* w = iw > 0 ? g.src(iw).node() : nullptr;
    g.add(0, Tensor(new_op(Op::LAYER_NORM_BACK, f32, x.shape(), {dy.node(), x.node(), w}, prm)));
  }
  const bool nw = iw > 0 && g.needs(iw), nb = ib > 0 && g.needs(ib);
  if (!nw && !nb) return;
  const int64_t d = x.shape()[x.ndim() - 1];
  Tensor aff(new_op(Op::LAYER_NORM_BACK_AFFINE, f32, Shape{2, d}, {dy.node(), x.node()}, prm));
  if (nw) g.add(iw, aff.narrow(0, 0, 1).view({d}));
  if (nb) g.add(ib, aff.narrow(0, 1, 1).view({d}));
}

// CROSS_ENTROPY (labels get no gradient): d logits = (softmax - one_hot) * g / N.
void backward_CROSS_ENTROPY(GradCtx& g) {
  if (!g.needs(0)) return;
  Tensor logits = g.src(0);
  g.add(0, Tensor(new_op(Op::CROSS_ENTROPY_BACK, f32, logits.shape(),
                         {logits.node(), g.src(1).node(), g.grad().node()})));
}

}  // namespace detail

}  // namespace kiln
