// Elementwise unary ops and activations. Builders + backward rules; each rule is
// the derivative written with kiln ops (reusing the forward output where cheaper).
#include <cmath>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

template <class P = NoParams>
Tensor unary(Op op, Tensor x, const P& p = {}) {
  const char* name = op_name(op);
  detail::check_defined(name, {x});
  detail::check_float32(name, "x", x);
  if constexpr (std::is_same_v<P, NoParams>)
    return Tensor(detail::new_op(op, f32, x.shape(), {x.node()}));
  else return Tensor(detail::new_op(op, f32, x.shape(), {x.node()}, p));
}

// 1.0 where x >= lo (or x > lo when strict), else 0.0
Tensor step(Tensor x, float lo, bool strict) {
  const Tensor c = full(x.ctx(), Shape{}, lo);
  return strict ? gt(x, c) : ge(x, c);
}

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kInvSqrt2Pi = 0.3989422804014327f;
constexpr float kTwoOverSqrtPi = 1.1283791670955126f;
constexpr float kGeluC = 0.044715f;

}  // namespace

Tensor neg(Tensor x) { return unary(Op::NEG, x); }
Tensor abs(Tensor x) { return unary(Op::ABS, x); }
Tensor sign(Tensor x) { return unary(Op::SIGN, x); }
Tensor sqr(Tensor x) { return unary(Op::SQR, x); }
Tensor sqrt(Tensor x) { return unary(Op::SQRT, x); }
Tensor rsqrt(Tensor x) { return unary(Op::RSQRT, x); }
Tensor exp(Tensor x) { return unary(Op::EXP, x); }
Tensor log(Tensor x) { return unary(Op::LOG, x); }
Tensor sin(Tensor x) { return unary(Op::SIN, x); }
Tensor cos(Tensor x) { return unary(Op::COS, x); }
Tensor pow(Tensor x, float exponent) { return unary(Op::POW, x, PowParams{exponent}); }
Tensor scale(Tensor x, float s, float bias) { return unary(Op::SCALE, x, ScaleParams{s, bias}); }
Tensor clamp(Tensor x, float lo, float hi) {
  if (!(lo <= hi)) fail("clamp", "lo ", lo, " is greater than hi ", hi);
  return unary(Op::CLAMP, x, ClampParams{lo, hi});
}
Tensor relu(Tensor x) { return unary(Op::RELU, x); }
Tensor leaky_relu(Tensor x, float slope) {
  return unary(Op::LEAKY_RELU, x, LeakyReluParams{slope});
}
// GELU also reads a bf16 x (f32 result): under the bf16 policy the CPU graph
// rewrites make a Linear store its output in bf16 for it (Graph::bf16_gelu_inputs).
Tensor gelu(Tensor x, GeluApprox approx) {
  const Op op = approx == GeluApprox::tanh ? Op::GELU : Op::GELU_ERF;
  detail::check_defined(op_name(op), {x});
  if (x.dtype() != f32 && x.dtype() != bf16)
    fail(op_name(op), "x must be f32 or bf16 but is ", dtype_name(x.dtype()), " ", x.shape().str());
  return Tensor(detail::new_op(op, f32, x.shape(), {x.node()}));
}
Tensor erf(Tensor x) { return unary(Op::ERF, x); }
Tensor silu(Tensor x) { return unary(Op::SILU, x); }
Tensor sigmoid(Tensor x) { return unary(Op::SIGMOID, x); }
Tensor tanh(Tensor x) { return unary(Op::TANH, x); }
Tensor softplus(Tensor x) { return unary(Op::SOFTPLUS, x); }

namespace detail {

void backward_NEG(GradCtx& g) { g.add(0, neg(g.grad())); }
void backward_ABS(GradCtx& g) { g.add(0, g.grad() * sign(g.src(0))); }
void backward_SQR(GradCtx& g) { g.add(0, scale(g.grad() * g.src(0), 2.0f)); }
void backward_SQRT(GradCtx& g) { g.add(0, scale(g.grad(), 0.5f) / g.out()); }
// d/dx x^(-1/2) = -x^(-3/2) / 2 = -y^3 / 2, from the output y.
void backward_RSQRT(GradCtx& g) {
  const Tensor y = g.out();
  g.add(0, scale(g.grad() * (y * sqr(y)), -0.5f));
}
void backward_EXP(GradCtx& g) { g.add(0, g.grad() * g.out()); }
void backward_LOG(GradCtx& g) { g.add(0, g.grad() / g.src(0)); }
void backward_SIN(GradCtx& g) { g.add(0, g.grad() * cos(g.src(0))); }
void backward_COS(GradCtx& g) { g.add(0, neg(g.grad() * sin(g.src(0)))); }
void backward_POW(GradCtx& g) {
  const float p = g.params<Op::POW>().exponent;
  // x^0 is constant: gradient 0 everywhere, also at x = 0 where 0 * 0^-1 would be
  // NaN (PyTorch returns zeros for a zero exponent too).
  if (p == 0.0f) {
    g.add(0, zeros(g.src(0).ctx(), g.src(0).shape()));
    return;
  }
  g.add(0, g.grad() * scale(pow(g.src(0), p - 1.0f), p));
}
void backward_SCALE(GradCtx& g) { g.add(0, scale(g.grad(), g.params<Op::SCALE>().mul)); }
void backward_CLAMP(GradCtx& g) {
  // Gradient flows where lo <= x <= hi (PyTorch's convention at the bounds).
  const Tensor x = g.src(0);
  const ClampParams p = g.params<Op::CLAMP>();
  const Tensor inside = step(x, p.lo, false) * le(x, full(x.ctx(), Shape{}, p.hi));
  g.add(0, g.grad() * inside);
}
// relu(x) > 0 exactly where x > 0: reading the output lets the planner free x.
void backward_RELU(GradCtx& g) { g.add(0, g.grad() * step(g.out(), 0.0f, true)); }
void backward_LEAKY_RELU(GradCtx& g) {
  const float a = g.params<Op::LEAKY_RELU>().slope;
  // mask*(1-a) + a: 1 where x > 0, a elsewhere
  g.add(0, g.grad() * scale(step(g.src(0), 0.0f, true), 1.0f - a, a));
}
void backward_SIGMOID(GradCtx& g) {
  const Tensor y = g.out();
  g.add(0, g.grad() * (y * scale(y, -1.0f, 1.0f)));
}
void backward_TANH(GradCtx& g) { g.add(0, g.grad() * scale(sqr(g.out()), -1.0f, 1.0f)); }
void backward_SOFTPLUS(GradCtx& g) { g.add(0, g.grad() * sigmoid(g.src(0))); }
void backward_SILU(GradCtx& g) {
  // d/dx x*s(x) = s * (1 + x*(1-s))
  const Tensor x = g.src(0), s = sigmoid(x);
  g.add(0, g.grad() * (s * scale(x * scale(s, -1.0f, 1.0f), 1.0f, 1.0f)));
}
void backward_ERF(GradCtx& g) {
  g.add(0, g.grad() * scale(exp(scale(sqr(g.src(0)), -1.0f)), kTwoOverSqrtPi));
}
namespace {

Tensor as_f32(Tensor x) { return x.dtype() == f32 ? x : x.to(f32); }

// dy * GELU'(x) in one fused node (GELU_BACK or GELU_ERF_BACK): one pass instead
// of the ten-odd elementwise nodes and temporaries of the derivative's formula.
Tensor gelu_back(Op op, Tensor dy, Tensor x) {
  if (dy.dtype() != f32) dy = dy.to(f32);  // the kernels read f32 dy, and f32 or bf16 x
  return Tensor(new_op(op, f32, x.shape(), {dy.node(), x.node()}));
}

}  // namespace

void backward_GELU_ERF(GradCtx& g) { g.add(0, gelu_back(Op::GELU_ERF_BACK, g.grad(), g.src(0))); }
void backward_GELU(GradCtx& g) { g.add(0, gelu_back(Op::GELU_BACK, g.grad(), g.src(0))); }

// The fused gradients are linear in dy: d/d dy is the same op on the incoming
// gradient; d/dx is dy * GELU''(x), written with kiln ops (double backward only).
void backward_GELU_ERF_BACK(GradCtx& g) {
  const Tensor dy = g.src(0), x = g.src(1);
  if (g.needs(0)) g.add(0, gelu_back(Op::GELU_ERF_BACK, g.grad(), x));
  if (g.needs(1)) {
    // d/dx (Phi(x) + x phi(x)) = phi(x) (2 - x^2)
    const Tensor x2 = sqr(as_f32(x));  // (the ops below take f32)
    const Tensor pdf = scale(exp(scale(x2, -0.5f)), kInvSqrt2Pi);
    g.add(1, g.grad() * dy * (pdf * scale(x2, -1.0f, 2.0f)));
  }
}
void backward_GELU_BACK(GradCtx& g) {
  const Tensor dy = g.src(0);
  if (g.needs(0)) g.add(0, gelu_back(Op::GELU_BACK, g.grad(), g.src(1)));
  if (g.needs(1)) {
    const Tensor x = as_f32(g.src(1));  // (the ops below take f32)
    // y' = 0.5(1+t) + 0.5x(1-t^2)u', t = tanh(u), u = c(x + k x^3), u' = c(1 + 3k x^2):
    // y'' = (1-t^2) (u' - x t u'^2 + 3ck x^2)
    const Tensor x2 = sqr(x);
    const Tensor t = tanh(scale(x + scale(x2 * x, kGeluC), kSqrt2OverPi));
    const Tensor du = scale(x2, 3.0f * kGeluC * kSqrt2OverPi, kSqrt2OverPi);
    const Tensor inner = du - x * t * sqr(du) + scale(x2, 3.0f * kGeluC * kSqrt2OverPi);
    g.add(1, g.grad() * dy * (scale(sqr(t), -1.0f, 1.0f) * inner));
  }
}

}  // namespace detail
}  // namespace kiln
