// Optimizer step builders (the ops' kernels are in the backends), their
// hyper-parameter tensors, and param initialisation helpers.
#include <cmath>
#include <random>

#include "kiln/detail/op_builder.h"
#include "kiln/opt.h"

namespace kiln {

namespace {

void check_state(const char* op, const char* what, Tensor param, Tensor t) {
  if (!t.defined()) fail(op, what, " is an undefined tensor");
  detail::check_float32(op, what, t);
  if (!(t.shape() == param.shape()))
    fail(op, what, " is ", t.shape().str(), " but param '", param.name(), "' is ", param.shape().str());
}

void check_common(const char* op, Tensor param, Tensor grad, Tensor hp) {
  detail::check_defined(op, {param, grad, hp});
  detail::check_float32(op, "param", param);
  if (param.node()->is_view())
    fail(op, "param '", param.name(), "' ", param.shape().str(),
         " is a view; optimizer steps update whole tensors in place");
  check_state(op, "grad", param, grad);
  detail::check_float32(op, "hyper-parameters", hp);
  if (hp.numel() != 8) fail(op, "hyper-parameters must be f32 [8], got ", hp.shape().str());
}

Tensor alias_of_param(TensorNode* n, Tensor param) {
  n->view_src = param.node();
  n->view_offs = 0;
  if (!param.name().empty()) n->name = param.name() + ".step";
  return Tensor(n);
}

// Uniform doubles in [0, 1) from the engine's raw output only (std::
// distributions differ between standard libraries).
double unit(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

void fill_with(Tensor t, const char* op, const std::function<float()>& f) {
  if (!t.defined()) fail(op, "tensor is undefined");
  if (!t.has_data()) fail(op, "'", t.name(), "' ", t.shape().str(), " has no memory yet (allocate first)");
  std::vector<float> v(size_t(t.numel()));
  for (float& x : v) x = f();
  if (t.dtype() == f32) {
    t.set(v);
    return;
  }
  std::vector<uint16_t> h(v.size());
  if (t.dtype() == f16)
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  else if (t.dtype() == bf16)
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  else
    fail(op, "'", t.name(), "' must be a floating-point tensor, is ", dtype_name(t.dtype()));
  t.set(h);
}

}  // namespace

Tensor adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor hp) {
  const char* op = op_name(Op::OPT_STEP_ADAMW);
  check_common(op, param, grad, hp);
  check_state(op, "m", param, m);
  check_state(op, "v", param, v);
  detail::check_same_ctx(op, {param, grad, m, v, hp});
  TensorNode* n = detail::new_op(Op::OPT_STEP_ADAMW, f32, param.shape(),
                                 {param.node(), grad.node(), m.node(), v.node(), hp.node()});
  return alias_of_param(n, param);
}

Tensor sgd_step(Tensor param, Tensor grad, Tensor buf, Tensor hp) {
  const char* op = op_name(Op::OPT_STEP_SGD);
  check_common(op, param, grad, hp);
  if (buf.defined()) check_state(op, "momentum buffer", param, buf);
  detail::check_same_ctx(op, {param, grad, buf, hp});
  TensorNode* n = buf.defined()
                      ? detail::new_op(Op::OPT_STEP_SGD, f32, param.shape(),
                                       {param.node(), grad.node(), buf.node(), hp.node()})
                      : detail::new_op(Op::OPT_STEP_SGD, f32, param.shape(), {param.node(), grad.node(), hp.node()});
  return alias_of_param(n, param);
}

const char* optimizer_name(OptimizerType t) { return t == OptimizerType::adamw ? "adamw" : "sgd"; }

float OptimizerParams::lr() const { return adamw.lr; }

OptimizerParams& OptimizerParams::set_lr(float lr) {
  adamw.lr = lr;
  sgd.lr = lr;
  return *this;
}

std::array<float, 8> adamw_hyper(const AdamWParams& p, int64_t t, float gscale) {
  if (t < 1) fail("adamw", "step count must be >= 1, got ", t);
  // Bias corrections in double: beta2^t stays accurate for large t.
  const double bc1 = 1.0 / (1.0 - std::pow(double(p.beta1), double(t)));
  const double bc2 = 1.0 / (1.0 - std::pow(double(p.beta2), double(t)));
  return {p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, float(bc1), float(bc2), gscale};
}

std::array<float, 8> sgd_hyper(const SgdParams& p, bool first_step, float gscale) {
  return {p.lr, p.momentum, p.dampening, p.nesterov ? 1.0f : 0.0f, p.weight_decay,
          first_step ? 1.0f : 0.0f, 0.0f, gscale};
}

void init_uniform(Tensor t, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  fill_with(t, "init_uniform", [&] { return float(lo + (double(hi) - lo) * unit(rng)); });
}

void init_normal(Tensor t, float mean, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Box-Muller on raw engine output (platform-independent).
  bool have = false;
  double spare = 0;
  fill_with(t, "init_normal", [&] {
    if (have) {
      have = false;
      return float(mean + stddev * spare);
    }
    double u1 = unit(rng), u2 = unit(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    spare = r * std::sin(a);
    have = true;
    return float(mean + stddev * r * std::cos(a));
  });
}

void kaiming_uniform(Tensor t, int64_t fan_in, uint64_t seed, float gain) {
  if (fan_in <= 0) fail("kaiming_uniform", "fan_in must be positive, got ", fan_in);
  const float b = float(gain * std::sqrt(3.0 / double(fan_in)));
  init_uniform(t, -b, b, seed);
}

void xavier_uniform(Tensor t, int64_t fan_in, int64_t fan_out, uint64_t seed, float gain) {
  if (fan_in <= 0 || fan_out <= 0)
    fail("xavier_uniform", "fan_in and fan_out must be positive, got ", fan_in, " and ", fan_out);
  const float b = float(gain * std::sqrt(6.0 / double(fan_in + fan_out)));
  init_uniform(t, -b, b, seed);
}

}  // namespace kiln
