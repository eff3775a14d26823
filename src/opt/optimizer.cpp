// Optimizer step builders (the ops' kernels are in the backends) and their
// hyper-parameter tensors. (Param initialisers: src/nn/init.cpp.)
#include <climits>
#include <cmath>

#include "kiln/ext/op_builder.h"
#include "kiln/opt.h"

namespace kiln {

namespace {

void check_state(const char* op, const char* what, Tensor param, Tensor t) {
  if (!t.defined()) fail(op, what, " is an undefined tensor");
  detail::check_float32(op, what, t);
  if (!(t.shape() == param.shape()))
    fail(op, what, " is ", t.shape().str(), " but param ", param.label(), " is ",
         param.shape().str());
}

void check_common(const char* op, Tensor param, Tensor grad, Tensor hp, int64_t hp_floats) {
  detail::check_defined(op, {param, grad, hp});
  detail::check_float32(op, "param", param);
  if (param.node()->is_view())
    fail(op, "param ", param.label(), " ", param.shape().str(),
         " is a view; optimizer steps update whole tensors in place");
  check_state(op, "grad", param, grad);
  detail::check_float32(op, "hyper-parameters", hp);
  if (hp.numel() != hp_floats)
    fail(op, "hyper-parameters must be f32 [", hp_floats, "], got ", hp.shape().str());
}

Tensor alias_of_param(TensorNode* n, Tensor param) {
  n->view_src = param.node();
  n->view_offs = 0;
  if (!param.name().empty()) n->name = param.name() + ".step";
  return Tensor(n);
}

}  // namespace

Tensor adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor hp) {
  const char* op = op_name(Op::ADAMW_STEP);
  check_common(op, param, grad, hp, hyper_floats<AdamWHyper>);
  check_state(op, "m", param, m);
  check_state(op, "v", param, v);
  detail::check_same_ctx(op, {param, grad, m, v, hp});
  TensorNode* n = detail::new_op(Op::ADAMW_STEP, f32, param.shape(),
                                 {param.node(), grad.node(), m.node(), v.node(), hp.node()});
  return alias_of_param(n, param);
}

Tensor adamw_step_multi(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor hp, Tensor segs) {
  const char* op = op_name(Op::ADAMW_STEP_MULTI);
  detail::check_defined(op, {param, grad, m, v, hp, segs});
  detail::check_same_ctx(op, {param, grad, m, v, hp, segs});
  auto flat = [&](const char* what, Tensor t) {
    detail::check_float32(op, what, t);
    if (t.shape().ndim() != 1 || !t.node()->is_contiguous())
      fail(op, what, " ", t.label(), " must be a contiguous f32 vector, got ", t.shape().str());
  };
  flat("param", param);
  flat("grad", grad);
  flat("m", m);
  flat("v", v);
  if (!(m.shape() == grad.shape()) || !(v.shape() == grad.shape()))
    fail(op, "grad, m and v must have one shape, got ", grad.shape().str(), ", ", m.shape().str(),
         ", ", v.shape().str());
  detail::check_float32(op, "hyper-parameters", hp);
  if (hp.shape().ndim() != 2 || hp.shape()[1] != hyper_floats<AdamWHyper>)
    fail(op, "hyper-parameters must be f32 [groups, ", hyper_floats<AdamWHyper>, "], got ",
         hp.shape().str());
  if (segs.dtype() != i32 || segs.shape().ndim() != 2 || segs.shape()[1] != 4)
    fail(op, "segments must be i32 [S, 4] (param offset, state offset, length, group), got ",
         dtype_name(segs.dtype()), " ", segs.shape().str());
  if (segs.shape()[0] > kMaxAdamWSegments)
    fail(op, "at most ", kMaxAdamWSegments, " segments per node, got ", segs.shape()[0]);
  if (param.numel() > INT32_MAX || grad.numel() > INT32_MAX)
    fail(op, "flat tensors of at most 2^31 - 1 elements (i32 offsets), got param ", param.numel(),
         ", state ", grad.numel());
  TensorNode* n =
      detail::new_op(Op::ADAMW_STEP_MULTI, f32, param.shape(),
                     {param.node(), grad.node(), m.node(), v.node(), hp.node(), segs.node()});
  return alias_of_param(n, param);
}

Tensor sgd_step(Tensor param, Tensor grad, Tensor buf, Tensor hp) {
  const char* op = op_name(Op::SGD_STEP);
  check_common(op, param, grad, hp, hyper_floats<SgdHyper>);
  if (buf.defined()) check_state(op, "momentum buffer", param, buf);
  detail::check_same_ctx(op, {param, grad, buf, hp});
  TensorNode* n = buf.defined() ? detail::new_op(Op::SGD_STEP, f32, param.shape(),
                                                 {param.node(), grad.node(), buf.node(), hp.node()})
                                : detail::new_op(Op::SGD_STEP, f32, param.shape(),
                                                 {param.node(), grad.node(), hp.node()});
  return alias_of_param(n, param);
}

const char* optimizer_name(OptimizerType t) { return t == OptimizerType::adamw ? "adamw" : "sgd"; }

float OptimizerParams::lr() const { return adamw.lr; }

OptimizerParams& OptimizerParams::set_lr(float lr) {
  adamw.lr = lr;
  sgd.lr = lr;
  return *this;
}

AdamWHyper adamw_hyper(const AdamWParams& p, int64_t t, float grad_scale) {
  if (t < 1) fail("adamw", "step count must be >= 1, got ", t);
  // Bias corrections in double: beta2^t stays accurate for large t.
  const double bc1 = 1.0 / (1.0 - std::pow(double(p.beta1), double(t)));
  const double bc2 = 1.0 / (1.0 - std::pow(double(p.beta2), double(t)));
  AdamWHyper h;
  h.lr = p.lr;
  h.beta1 = p.beta1;
  h.beta2 = p.beta2;
  h.eps = p.eps;
  h.weight_decay = p.weight_decay;
  h.bias_correction1 = float(bc1);
  h.bias_correction2 = float(bc2);
  h.grad_scale = grad_scale;
  return h;
}

SgdHyper sgd_hyper(const SgdParams& p, bool first_step, float grad_scale) {
  SgdHyper h;
  h.lr = p.lr;
  h.momentum = p.momentum;
  h.dampening = p.dampening;
  h.weight_decay = p.weight_decay;
  h.nesterov = p.nesterov ? 1.0f : 0.0f;
  h.first_step = first_step ? 1.0f : 0.0f;
  h.grad_scale = grad_scale;
  return h;
}

}  // namespace kiln
