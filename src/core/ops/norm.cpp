// Normalisation builders: layer_norm (the fused LAYER_NORM primitive, whose rule
// uses LAYER_NORM_BACK and LAYER_NORM_BACK_AFFINE) and rms_norm (a composite).
//
// Semantics decisions (PyTorch unless noted):
// - layer_norm / rms_norm normalise the last axis only (normalized_shape = [D]);
//   biased variance as PyTorch; eps >= 0. layer_norm is one fused primitive
//   (LAYER_NORM); cross_entropy with i32 labels too (CROSS_ENTROPY).
#include <cmath>
#include <utility>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

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

namespace detail {

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

}  // namespace detail

}  // namespace kiln
