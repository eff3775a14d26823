// Elementwise binary ops with numpy broadcasting, comparisons, where,
// and the arithmetic operators. Builders + backward rules.
#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

Tensor binary(Op op, Tensor a, Tensor b) {
  const char* name = op_name(op);
  detail::check_defined(name, {a, b});
  detail::check_same_ctx(name, {a, b});
  detail::check_float32(name, "a", a);
  detail::check_float32(name, "b", b);
  const Shape s = detail::broadcast_shapes(name, a.shape(), b.shape());
  return Tensor(detail::new_op(op, f32, s, {a.node(), b.node()}));
}

Tensor compare(CompareMode k, Tensor a, Tensor b) {
  detail::check_defined("compare", {a, b});
  detail::check_same_ctx("compare", {a, b});
  if (a.dtype() != b.dtype() || (a.dtype() != f32 && a.dtype() != i32))
    fail("compare", "a is ", dtype_name(a.dtype()), " ", a.shape().str(), " and b is ",
         dtype_name(b.dtype()), " ", b.shape().str(), ": both must be f32 or both i32");
  const Shape s = detail::broadcast_shapes("compare", a.shape(), b.shape());
  return Tensor(detail::new_op(Op::COMPARE, f32, s, {a.node(), b.node()}, CompareParams{k}));
}

Tensor scalar_like(Tensor x, float v) { return full(x.ctx(), Shape{}, v, x.dtype()); }

}  // namespace

Tensor add(Tensor a, Tensor b) { return binary(Op::ADD, a, b); }
Tensor sub(Tensor a, Tensor b) { return binary(Op::SUB, a, b); }
Tensor mul(Tensor a, Tensor b) { return binary(Op::MUL, a, b); }
Tensor div(Tensor a, Tensor b) { return binary(Op::DIV, a, b); }

Tensor eq(Tensor a, Tensor b) { return compare(CompareMode::eq, a, b); }
Tensor ne(Tensor a, Tensor b) { return compare(CompareMode::ne, a, b); }
Tensor lt(Tensor a, Tensor b) { return compare(CompareMode::lt, a, b); }
Tensor le(Tensor a, Tensor b) { return compare(CompareMode::le, a, b); }
Tensor gt(Tensor a, Tensor b) { return compare(CompareMode::gt, a, b); }
Tensor ge(Tensor a, Tensor b) { return compare(CompareMode::ge, a, b); }
Tensor gt(Tensor a, float b) { return compare(CompareMode::gt, a, scalar_like(a, b)); }
Tensor lt(Tensor a, float b) { return compare(CompareMode::lt, a, scalar_like(a, b)); }

Tensor where(Tensor cond, Tensor a, Tensor b) {
  detail::check_defined("where", {cond, a, b});
  detail::check_same_ctx("where", {cond, a, b});
  if (cond.dtype() != f32 && cond.dtype() != i32)
    fail("where", "cond must be f32 or i32 but is ", dtype_name(cond.dtype()));
  detail::check_float32("where", "a", a);
  detail::check_float32("where", "b", b);
  Shape s = detail::broadcast_shapes("where", a.shape(), b.shape());
  s = detail::broadcast_shapes("where", cond.shape(), s);
  return Tensor(detail::new_op(Op::WHERE, f32, s, {cond.node(), a.node(), b.node()}));
}

Tensor operator+(Tensor a, Tensor b) { return add(a, b); }
Tensor operator-(Tensor a, Tensor b) { return sub(a, b); }
Tensor operator*(Tensor a, Tensor b) { return mul(a, b); }
Tensor operator/(Tensor a, Tensor b) { return div(a, b); }
Tensor operator-(Tensor a) { return neg(a); }
Tensor operator+(Tensor a, float b) { return scale(a, 1.0f, b); }
Tensor operator-(Tensor a, float b) { return scale(a, 1.0f, -b); }
Tensor operator*(Tensor a, float b) { return scale(a, b); }
Tensor operator/(Tensor a, float b) { return scale(a, 1.0f / b); }
Tensor operator+(float a, Tensor b) { return scale(b, 1.0f, a); }
Tensor operator-(float a, Tensor b) { return scale(b, -1.0f, a); }
Tensor operator*(float a, Tensor b) { return scale(b, a); }

namespace detail {

void backward_ADD(GradCtx& g) {
  if (g.needs(0)) g.add(0, sum_to(g.grad(), g.src(0).shape()));
  if (g.needs(1)) g.add(1, sum_to(g.grad(), g.src(1).shape()));
}

void backward_SUB(GradCtx& g) {
  if (g.needs(0)) g.add(0, sum_to(g.grad(), g.src(0).shape()));
  if (g.needs(1)) g.add(1, neg(sum_to(g.grad(), g.src(1).shape())));
}

void backward_MUL(GradCtx& g) {
  if (g.needs(0)) g.add(0, sum_to(g.grad() * g.src(1), g.src(0).shape()));
  if (g.needs(1)) g.add(1, sum_to(g.grad() * g.src(0), g.src(1).shape()));
}

void backward_DIV(GradCtx& g) {
  // d(a/b)/da = 1/b, d(a/b)/db = -(a/b)/b
  if (g.needs(0)) g.add(0, sum_to(g.grad() / g.src(1), g.src(0).shape()));
  if (g.needs(1)) g.add(1, neg(sum_to(g.grad() * g.out() / g.src(1), g.src(1).shape())));
}

void backward_WHERE(GradCtx& g) {
  const Tensor zero = full(g.grad().ctx(), Shape{}, 0.0f);
  if (g.needs(1)) g.add(1, sum_to(where(g.src(0), g.grad(), zero), g.src(1).shape()));
  if (g.needs(2)) g.add(2, sum_to(where(g.src(0), zero, g.grad()), g.src(2).shape()));
}

}  // namespace detail
}  // namespace kiln
