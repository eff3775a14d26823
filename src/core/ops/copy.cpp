// Copies and constants: contiguous / to (COPY, with dtype conversion), full and
// its relatives (FULL), dropout (a RAND_MASK times x). Builders + the backward
// rule of COPY.
//
// Semantics decisions (PyTorch unless noted):
// - dropout: p in [0, 1); identity when !training or p == 0. The mask depends only
//   on (seed ^ seed_tensor[0], element index), see kiln/ext/rng.h.
#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor Tensor::contiguous() const {
  detail::check_defined("contiguous", {*this});
  if (node()->is_contiguous()) return *this;
  if (is_quantized(dtype()))
    fail("contiguous", "cannot copy the ", dtype_name(dtype()), " view ", label(), " ",
         shape().str(), ": a quantized tensor is copied only to f32 (.to(f32))");
  return Tensor(detail::new_op(Op::COPY, dtype(), shape(), {node()}));
}

Tensor Tensor::to(DType t) const {
  detail::check_defined("copy", {*this});
  if (t == dtype()) return *this;
  // Quantized tensors convert to and from f32 only, whole rows of blocks at a time.
  if (is_quantized(dtype()) && t != f32)
    fail("copy", label(), " ", shape().str(), " is ", dtype_name(dtype()),
         ": it converts only to f32, not ", dtype_name(t));
  if (is_quantized(dtype()) && node()->quant_axis() != ndim() - 1)
    fail("copy", label(), " ", shape().str(), " is a transposed ", dtype_name(dtype()),
         " view: dequantize the tensor, then transpose");
  if (is_quantized(t) && dtype() != f32)
    fail("copy", "only f32 tensors quantize to ", dtype_name(t), "; ", label(), " is ",
         dtype_name(dtype()));
  return Tensor(detail::new_op(Op::COPY, t, shape(), {node()}));
}

Tensor full(Context& ctx, const Shape& s, float value, DType t) {
  if (t != f32 && t != i32) fail("full", "dtype must be f32 or i32, got ", dtype_name(t));
  TensorNode* n = ctx.new_node(t, s, Op::FULL);
  detail::set_params(*n, FillParams{value});
  return Tensor(n);
}
Tensor zeros(Context& ctx, const Shape& s, DType t) { return full(ctx, s, 0.0f, t); }
Tensor ones(Context& ctx, const Shape& s, DType t) { return full(ctx, s, 1.0f, t); }
Tensor full_like(Tensor x, float value) {
  detail::check_defined("full_like", {x});
  return full(x.ctx(), x.shape(), value, x.dtype() == i32 ? i32 : f32);
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

void backward_COPY(GradCtx& g) {
  const Tensor gr = g.grad();
  const DType t = g.src(0).dtype();
  if (is_quantized(t) || is_quantized(g.out().dtype()))
    fail("copy", "no gradient flows through quantization (", g.out().label(),
         "): quantized tensors are frozen");
  g.add(0, gr.dtype() == t ? gr : gr.to(t));
}

}  // namespace detail
}  // namespace kiln
