// Normalisation builders: layer_norm (the fused LAYER_NORM primitive, whose rule
// uses LAYER_NORM_BACK and LAYER_NORM_BACK_AFFINE) and rms_norm (the fused
// RMS_NORM, whose rule uses RMS_NORM_BACK and RMS_NORM_BACK_WEIGHT).
//
// Semantics decisions (PyTorch unless noted):
// - layer_norm / rms_norm normalise the last axis only (normalized_shape = [D]);
//   biased variance as PyTorch; eps >= 0. Each is one fused primitive: one pass
//   over a row instead of the five nodes and four [.., D] temporaries of the
//   composite (sqr, mean, scale, sqrt, div).
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
  const RmsNormParams prm{eps, weight.defined()};
  return Tensor(detail::new_op(Op::RMS_NORM, f32, x.shape(), {x.node(), weight.node()}, prm));
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

// RMS_NORM: dx by RMS_NORM_BACK, d weight by one reduction over rows
// (RMS_NORM_BACK_WEIGHT).
void backward_RMS_NORM(GradCtx& g) {
  const RmsNormParams prm = g.params<Op::RMS_NORM>();
  Tensor x = g.src(0), dy = g.grad();
  if (g.needs(0)) {
    TensorNode* w = prm.has_weight ? g.src(1).node() : nullptr;
    g.add(0, Tensor(new_op(Op::RMS_NORM_BACK, f32, x.shape(), {dy.node(), x.node(), w}, prm)));
  }
  if (prm.has_weight && g.needs(1)) {
    const Shape d{x.shape()[x.ndim() - 1]};
    g.add(1, Tensor(new_op(Op::RMS_NORM_BACK_WEIGHT, f32, d, {dy.node(), x.node()}, prm)));
  }
}

}  // namespace detail

}  // namespace kiln
