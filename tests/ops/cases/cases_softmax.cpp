// Cases: softmax / log_softmax (scale, masks, causal).
#include <cmath>
#include <limits>

#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

SpecFn softmax_spec(double scale, bool mask, bool causal, bool log) {
  return [=](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    w.v = log_softmax_rows(in[0], scale, mask ? &in[1] : nullptr, causal);
    if (!log)
      for (double& v : w.v) v = std::exp(v);
    return spec_compare(w, out);
  };
}

void add_softmax(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 1024), S = z(19, 256);
  const Gen mg = gen::uniform(-2, 0);
  struct Sm {
    std::string name;
    std::vector<Input> ins;
    float scale;
    bool mask, causal;
    bool grad = true;
  };
  std::vector<Sm> sms = {
      {"plain", {in("x", {R, C}, gen::uniform(-3, 3))}, 1.0f, false, false},
      {"scale", {in("x", {R, C}, gen::uniform(-3, 3))}, 0.5f, false, false},
      {"mask_row", {in("x", {R, C}), constant(in("mask", {C}, mg))}, 1.0f, true, false},
      {"mask_2d_scaled", {in("x", {R, C}), constant(in("mask", {R, C}, mg))}, 2.0f, true, false},
      // A learned additive bias (e.g. relative positions) gets a gradient too.
      {"mask_grad", {in("x", {R, C}), in("mask", {R, C}, mg)}, 1.0f, true, false},
      {"causal_square", {in("x", {S, S})}, 1.0f, false, true},
      {"causal_rect", {in("x", {R, C})}, 1.0f, false, true},
      {"causal_3d_scale_mask",
       {in("x", {2, R, C}), constant(in("mask", {R, C}, mg))},
       0.7f,
       true,
       true},
      {"transposed",
       {with(in("x", {R, C}, gen::uniform(-3, 3)), Layout::transposed)},
       1.0f,
       false,
       false},
      {"narrowed_3d", {with(in("x", {2, R, C}), Layout::narrowed)}, 1.0f, false, false},
      {"neg_inf_mask",
       {in("x", {R, C}), constant(in("mask", {C}, gen::values({0, -kInf, -1, 0, -kInf, 0.5})))},
       1.0f,
       true,
       false},
      {"large_values", {in("x", {R, C}, gen::uniform(-100, 100))}, 1.0f, false, false, false},
  };
  for (const Sm& sm : sms) {
    for (int log = 0; log < 2; ++log) {
      const float scale = sm.scale;
      const bool mask = sm.mask, causal = sm.causal;
      auto build = [=](Context&, X x) {
        SoftmaxOptions o;
        o.scale = scale;
        if (mask) o.mask = x[1];
        o.causal = causal;
        return log ? log_softmax(x[0], o) : softmax(x[0], o);
      };
      const bool grad = sm.grad;
      Case c = make_case(std::string(log ? "log_softmax_" : "softmax_") + sm.name,
                         {log ? Op::LOG_SOFTMAX : Op::SOFTMAX}, sm.ins, build, grad);
      c.spec = softmax_spec(scale, mask, causal, log);
      if (sm.name == "large_values") c.tol = {1e-5, 1e-4};
      cs.push_back(c);
    }
  }
}

}  // namespace

void add_softmax_cases(std::vector<Case>& cs, Sz z) { add_softmax(cs, z); }

}  // namespace kiln::test
