// Reductions: sum / mean / max over all elements or one axis, argmax,
// count_equal, and sum_to (the broadcast adjoint used by backward rules).
#include <limits>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

Shape reduced_shape(const Shape& s, int axis, bool keepdim) {
  Shape out;
  for (int d = 0; d < s.ndim(); ++d) {
    if (d != axis) out.push_back(s[d]);
    else if (keepdim) out.push_back(1);
  }
  return out;
}

Tensor reduce_all(Op op, Tensor x) {
  const char* name = op_name(op);
  detail::check_defined(name, {x});
  detail::check_float32(name, "x", x);
  if (x.numel() == 0 && op == Op::MAX)
    fail(name, "cannot reduce an empty tensor ", x.shape().str());
  return Tensor(detail::new_op(op, f32, Shape{}, {x.node()}, ReduceParams{-1, false}));
}

Tensor reduce_axis(Op op, Tensor x, int axis, bool keepdim, DType out_t = f32) {
  const char* name = op_name(op);
  detail::check_defined(name, {x});
  if (op != Op::ARGMAX) detail::check_float32(name, "x", x);
  else if (x.dtype() != f32 && x.dtype() != i32)
    fail(name, "x must be f32 or i32 but is ", dtype_name(x.dtype()));
  const int a = detail::norm_axis(name, axis, x.ndim());
  if (x.shape()[a] == 0 && op != Op::SUM)
    fail(name, "cannot reduce the empty dim ", axis, " of ", x.shape().str());
  return Tensor(detail::new_op(op, out_t, reduced_shape(x.shape(), a, keepdim), {x.node()},
                               ReduceParams{a, keepdim}));
}

// The reduction's output gradient spread back over the source's shape.
Tensor spread(Tensor grad, const TensorNode* node) {
  const Shape& src = node->src[0]->shape;
  const int64_t axis = op_params<ReduceParams>(*node).axis;
  if (axis < 0) return grad.reshape(Shape{}).expand(src);
  return grad.reshape(reduced_shape(src, int(axis), true)).expand(src);
}

}  // namespace

Tensor sum(Tensor x) { return reduce_all(Op::SUM, x); }
Tensor sum(Tensor x, int axis, bool keepdim) { return reduce_axis(Op::SUM, x, axis, keepdim); }
Tensor max(Tensor x) { return reduce_all(Op::MAX, x); }
Tensor max(Tensor x, int axis, bool keepdim) { return reduce_axis(Op::MAX, x, axis, keepdim); }
Tensor mean(Tensor x) {
  detail::check_defined("mean", {x});
  Tensor s = sum(x);
  // The mean of nothing is 0 / 0 = NaN, as in PyTorch.
  return scale(s, x.numel() ? 1.0f / float(x.numel()) : std::numeric_limits<float>::quiet_NaN());
}
Tensor mean(Tensor x, int axis, bool keepdim) {
  detail::check_defined("mean", {x});
  const int64_t n = x.shape()[detail::norm_axis("mean", axis, x.ndim())];
  Tensor s = sum(x, axis, keepdim);
  return scale(s, n ? 1.0f / float(n) : std::numeric_limits<float>::quiet_NaN());
}
Tensor argmax(Tensor x, int axis, bool keepdim) {
  return reduce_axis(Op::ARGMAX, x, axis, keepdim, i32);
}

Tensor topk_indices(Tensor x, int64_t k) {
  detail::check_defined("topk", {x});
  detail::check_float32("topk", "x", x);
  if (x.ndim() < 1 || x.ndim() >= kMaxDims)
    fail("topk", "x is ", x.shape().str(), ": it needs 1 to ", kMaxDims - 1, " dims");
  const int64_t C = x.size(-1);
  if (k < 1 || k > C)
    fail("topk", "k = ", k, " but x ", x.shape().str(), " has ", C,
         " values per row: k must be in [1, ", C, "]");
  Shape s = x.shape();
  s[s.ndim() - 1] = k;
  return Tensor(detail::new_op(Op::TOPK, i32, s, {x.node()}, TopkParams{k}));
}

Tensor count_equal(Tensor a, Tensor b) {
  detail::check_defined("count_equal", {a, b});
  detail::check_same_ctx("count_equal", {a, b});
  if (!(a.shape() == b.shape()) || a.dtype() != b.dtype())
    fail("count_equal", "a is ", dtype_name(a.dtype()), " ", a.shape().str(), " but b is ",
         dtype_name(b.dtype()), " ", b.shape().str(), ": shapes and dtypes must match");
  return Tensor(detail::new_op(Op::COUNT_EQUAL, i32, Shape{}, {a.node(), b.node()}));
}

Tensor sum_to(Tensor x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int nd = x.ndim(), off = nd - shape.ndim();
  if (off < 0) fail("sum_to", "cannot sum ", x.shape().str(), " to more dims ", shape.str());
  Tensor r = x;
  for (int d = 0; d < nd; ++d) {
    const int64_t want = d < off ? 1 : shape[d - off];
    if (r.shape()[d] == want) continue;
    if (want != 1) fail("sum_to", "cannot sum ", x.shape().str(), " to ", shape.str());
    r = sum(r, d, true);
  }
  return r.reshape(shape);
}

namespace detail {

void backward_SUM(GradCtx& g) { g.add(0, spread(g.grad(), g.out().node())); }

void backward_MAX(GradCtx& g) {
  // The gradient goes to every element equal to the max (ties share it fully).
  const TensorNode* n = g.out().node();
  const Tensor x = g.src(0);
  const Tensor mask = eq(x, spread(g.out(), n));
  g.add(0, mask * spread(g.grad(), n));
}

}  // namespace detail
}  // namespace kiln
