// Cases: elementwise unary ops, each contiguous and through a transposed view,
// with inputs inside the op's domain and away from its kinks; extreme values
// (stability) in eval-only cases.
#include <cmath>
#include <numbers>

#include "kiln/ext/op_params.h"
#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;
using UnFn = std::function<Tensor(Tensor)>;

struct Un {
  std::string name;
  Op op;
  UnFn f;
  Gen g;
  std::function<double(double)> want;  // the API promise (for the spec)
};

SpecFn map_unary_spec(std::function<double(double)> f) {
  return [f](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    for (double& v : w.v) v = f(v);
    return spec_compare(w, out);
  };
}

double sigm(double x) { return 1 / (1 + std::exp(-x)); }

std::vector<Un> unaries() {
  using gen::uniform;
  return {
      {"neg", Op::NEG, [](Tensor x) { return kiln::neg(x); }, uniform(-2, 2),
       [](double x) { return -x; }},
      {"abs", Op::ABS, [](Tensor x) { return kiln::abs(x); }, gen::away_from(-2, 2, {0}),
       [](double x) { return std::fabs(x); }},
      {"sqr", Op::SQR, [](Tensor x) { return kiln::sqr(x); }, uniform(-2, 2),
       [](double x) { return x * x; }},
      {"sqrt", Op::SQRT, [](Tensor x) { return kiln::sqrt(x); }, uniform(0.1, 4),
       [](double x) { return std::sqrt(x); }},
      {"rsqrt", Op::RSQRT, [](Tensor x) { return kiln::rsqrt(x); }, uniform(0.1, 4),
       [](double x) { return 1 / std::sqrt(x); }},
      {"exp", Op::EXP, [](Tensor x) { return kiln::exp(x); }, uniform(-3, 3),
       [](double x) { return std::exp(x); }},
      {"log", Op::LOG, [](Tensor x) { return kiln::log(x); }, uniform(0.1, 5),
       [](double x) { return std::log(x); }},
      {"sin", Op::SIN, [](Tensor x) { return kiln::sin(x); }, uniform(-4, 4),
       [](double x) { return std::sin(x); }},
      {"cos", Op::COS, [](Tensor x) { return kiln::cos(x); }, uniform(-4, 4),
       [](double x) { return std::cos(x); }},
      {"pow_2", Op::POW, [](Tensor x) { return kiln::pow(x, 2.0f); }, uniform(-2, 2),
       [](double x) { return x * x; }},
      {"pow_3", Op::POW, [](Tensor x) { return kiln::pow(x, 3.0f); }, uniform(-2, 2),
       [](double x) { return x * x * x; }},
      {"pow_half", Op::POW, [](Tensor x) { return kiln::pow(x, 0.5f); }, uniform(0.1, 4),
       [](double x) { return std::sqrt(x); }},
      {"pow_neg_1_5", Op::POW, [](Tensor x) { return kiln::pow(x, -1.5f); }, uniform(0.3, 3),
       [](double x) { return std::pow(x, -1.5); }},
      {"scale", Op::SCALE, [](Tensor x) { return kiln::scale(x, 1.5f, -0.25f); }, uniform(-2, 2),
       [](double x) { return 1.5 * x - 0.25; }},
      {"clamp", Op::CLAMP, [](Tensor x) { return kiln::clamp(x, -0.5f, 0.7f); },
       gen::away_from(-2, 2, {-0.5, 0.7}),
       [](double x) { return std::min(std::max(x, -0.5), 0.7); }},
      {"relu", Op::RELU, [](Tensor x) { return kiln::relu(x); }, gen::away_from(-2, 2, {0}),
       [](double x) { return std::max(x, 0.0); }},
      {"leaky_relu_default", Op::LEAKY_RELU, [](Tensor x) { return kiln::leaky_relu(x); },
       gen::away_from(-2, 2, {0}), [](double x) { return x > 0 ? x : 0.01 * x; }},
      {"leaky_relu_0_2", Op::LEAKY_RELU, [](Tensor x) { return kiln::leaky_relu(x, 0.2f); },
       gen::away_from(-2, 2, {0}), [](double x) { return x > 0 ? x : double(0.2f) * x; }},
      {"gelu_tanh", Op::GELU, [](Tensor x) { return kiln::gelu(x, GeluApprox::tanh); },
       uniform(-4, 4),
       [](double x) {
         return 0.5 * x *
                (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
       }},
      {"gelu_erf", Op::GELU_ERF, [](Tensor x) { return kiln::gelu(x); }, uniform(-4, 4),
       [](double x) { return 0.5 * x * (1 + std::erf(x / std::numbers::sqrt2)); }},
      {"erf", Op::ERF, [](Tensor x) { return kiln::erf(x); }, uniform(-3, 3),
       [](double x) { return std::erf(x); }},
      {"silu", Op::SILU, [](Tensor x) { return kiln::silu(x); }, uniform(-5, 5),
       [](double x) { return x * sigm(x); }},
      {"sigmoid", Op::SIGMOID, [](Tensor x) { return kiln::sigmoid(x); }, uniform(-5, 5), sigm},
      {"tanh", Op::TANH, [](Tensor x) { return kiln::tanh(x); }, uniform(-4, 4),
       [](double x) { return std::tanh(x); }},
      {"softplus", Op::SOFTPLUS, [](Tensor x) { return kiln::softplus(x); }, uniform(-5, 5),
       [](double x) { return std::log1p(std::exp(x)); }},
  };
}

}  // namespace

void add_unary_cases(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 1024);
  for (const Un& u : unaries()) {
    UnFn f = u.f;
    Case c = make_case(
        u.name, {u.op}, {in("x", {R, C}, u.g)}, [f](Context&, X x) { return f(x[0]); }, true);
    c.spec = map_unary_spec(u.want);
    cs.push_back(c);
    // Strided source (transposed view): the kernel's generic path and the
    // view's backward rule.
    cs.push_back(make_case(
        u.name + "_strided", {u.op, Op::PERMUTE}, {with(in("x", {R, C}, u.g), Layout::transposed)},
        [f](Context&, X x) { return f(x[0]); }, true));
  }
  // 3-D, narrowed rows for a couple of ops with vectorised fast paths.
  cs.push_back(make_case(
      "exp_narrowed_3d", {Op::EXP, Op::NARROW},
      {with(in("x", {2, R, z(21, 1000)}), Layout::narrowed)},
      [](Context&, X x) { return kiln::exp(x[0]); }, true));
  cs.push_back(make_case(
      "tanh_expanded", {Op::TANH, Op::EXPAND}, {expanded(in("x", {R, C}), {1, C})},
      [](Context&, X x) { return kiln::tanh(x[0]); }, true));

  // SIGN has no gradient; zeros and NaN must give 0 (torch.sign).
  Case sg = make_case(
      "sign", {Op::SIGN}, {in("x", {R, C}, gen::choice({-2, -0.5, 0, 0.5, 3, NAN}))},
      [](Context&, X x) { return kiln::sign(x[0]); }, false);
  sg.tol = {0, 0};
  cs.push_back(sg);
  cs.push_back(make_case(
      "sign_strided", {Op::SIGN}, {with(in("x", {R, C}, gen::uniform(-1, 1)), Layout::transposed)},
      [](Context&, X x) { return kiln::sign(x[0]); }, false));

  // GELU's fused gradients directly (their own gradients are the double-backward
  // rules): contiguous, transposed views, and dy broadcast along rows.
  for (const Op op : {Op::GELU_BACK, Op::GELU_ERF_BACK}) {
    const std::string name = op == Op::GELU_BACK ? "gelu_back" : "gelu_erf_back";
    const Shape xs{R, C};
    auto back = [op, xs](Context&, X x) {
      return detail::make_op(op, DType::f32, xs, {x[0], x[1]});
    };
    cs.push_back(
        make_case(name, {op}, {in("dy", xs), in("x", xs, gen::uniform(-4, 4))}, back, true));
    cs.push_back(make_case(name + "_strided", {op, Op::PERMUTE},
                           {with(in("dy", xs), Layout::transposed),
                            with(in("x", xs, gen::uniform(-4, 4)), Layout::transposed)},
                           back, true));
    cs.push_back(make_case(name + "_expanded", {op, Op::EXPAND},
                           {expanded(in("dy", xs), {1, C}), in("x", xs, gen::uniform(-4, 4))}, back,
                           true));
  }

  // GELU with a bf16 x (f32 result), the input the CPU rewrites give it under
  // the bf16 policy (Graph::bf16_gelu_inputs): the f32 op on the widened
  // values. Contiguous (chunks widened in vectors) and transposed (gathered);
  // the fused gradients with a bf16 x (dy stays f32: its gradient is checked);
  // and gelu(x.to(bf16)) with an f32 x, whose gradient flows through the cast
  // (finite differences cannot see through the rounding: no_fd).
  for (const bool erf : {false, true}) {
    const std::string name = erf ? "gelu_erf" : "gelu_tanh";
    const Op op = erf ? Op::GELU_ERF : Op::GELU, back = erf ? Op::GELU_ERF_BACK : Op::GELU_BACK;
    const GeluApprox approx = erf ? GeluApprox::none : GeluApprox::tanh;
    const Input xb = as(in("x", {R, C}, gen::uniform(-4, 4)), DType::bf16);
    auto f = [approx](Context&, X x) { return kiln::gelu(x[0], approx); };
    cs.push_back(make_case(name + "_bf16_x", {op}, {xb}, f, false));
    cs.push_back(make_case(name + "_bf16_x_strided", {op, Op::PERMUTE},
                           {with(xb, Layout::transposed)}, f, false));
    const std::string bname = erf ? "gelu_erf_back" : "gelu_back";
    const Shape xs{R, C};
    auto bk = [back, xs](Context&, X x) {
      return detail::make_op(back, DType::f32, xs, {x[0], x[1]});
    };
    cs.push_back(make_case(bname + "_bf16_x", {back}, {in("dy", xs), xb}, bk, true));
    cs.push_back(make_case(bname + "_bf16_x_strided", {back, Op::PERMUTE},
                           {with(in("dy", xs), Layout::transposed), with(xb, Layout::transposed)},
                           bk, true));
    cs.push_back(no_fd(make_case(
        name + "_of_bf16_cast", {op, back, Op::COPY}, {in("x", {R, C}, gen::uniform(-4, 4))},
        [approx](Context&, X x) { return kiln::gelu(x[0].to(bf16), approx); }, true)));
  }

  // Extreme inputs: the stable formulations must not overflow or give NaN.
  const Gen extreme = gen::values({-100, -30, -20, -5, 0, 5, 20, 30, 100, -88, 88, 1e-3});
  struct Ext {
    const char* name;
    Op op;
    Tensor (*f)(Tensor);
  };
  const Ext exts[] = {
      {"softplus_extreme", Op::SOFTPLUS, [](Tensor x) { return kiln::softplus(x); }},
      {"sigmoid_extreme", Op::SIGMOID, [](Tensor x) { return kiln::sigmoid(x); }},
      {"tanh_extreme", Op::TANH, [](Tensor x) { return kiln::tanh(x); }},
      {"silu_extreme", Op::SILU, [](Tensor x) { return kiln::silu(x); }},
      {"gelu_tanh_extreme", Op::GELU, [](Tensor x) { return kiln::gelu(x, GeluApprox::tanh); }},
      {"gelu_erf_extreme", Op::GELU_ERF, [](Tensor x) { return kiln::gelu(x); }},
      {"erf_extreme", Op::ERF, [](Tensor x) { return kiln::erf(x); }},
  };
  for (const Ext& e : exts) {
    auto f = e.f;
    cs.push_back(make_case(
        e.name, {e.op}, {in("x", {3, 4}, extreme)}, [f](Context&, X x) { return f(x[0]); }, false));
  }
  for (const Op op : {Op::GELU_BACK, Op::GELU_ERF_BACK}) {
    const std::string name = op == Op::GELU_BACK ? "gelu_back_extreme" : "gelu_erf_back_extreme";
    cs.push_back(make_case(
        name, {op}, {in("dy", {3, 4}, gen::uniform(0.5, 2)), in("x", {3, 4}, extreme)},
        [op](Context&, X x) {
          return detail::make_op(op, DType::f32, {3, 4}, {x[0], x[1]});
        },
        false));
  }
}

}  // namespace kiln::test
