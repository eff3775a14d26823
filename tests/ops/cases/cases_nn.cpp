// Cases: softmax / log_softmax (scale, masks, causal), losses (cross-entropy with
// labels and with probabilities, MSE), one_hot, layer_norm and rms_norm.
#include <cmath>
#include <limits>

#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;
constexpr double kInf = std::numeric_limits<double>::infinity();

// log-softmax of each last-dim row of (scale*x + mask) with the causal rule,
// written independently of the reference (PyTorch semantics).
std::vector<double> log_softmax_rows(const RefValue& x, double scale, const RefValue* mask,
                                     bool causal) {
  const int nd = x.shape.ndim();
  const int64_t C = x.shape[nd - 1], R = nd >= 2 ? x.shape[nd - 2] : 1;
  std::vector<double> out(x.v.size());
  Index it(x.shape);
  do {
    const size_t k = size_t(ref_linear(x.shape, it.i));
    double v = scale * x.v[k];
    if (mask) v += ref_bcast_at(*mask, it.i, nd);
    const int64_t row = nd >= 2 ? it.i[nd - 2] : 0, col = it.i[nd - 1];
    out[k] = causal && col > row + (C - R) ? -kInf : v;
  } while (it.next());
  for (size_t r0 = 0; r0 < out.size(); r0 += size_t(C)) {
    double m = -kInf, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, out[r0 + size_t(c)]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(out[r0 + size_t(c)] - m);
    for (int64_t c = 0; c < C; ++c) out[r0 + size_t(c)] -= m + std::log(s);
  }
  return out;
}

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

void add_losses(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(4, 512), C = z(37, 1000);
  auto ce_labels_spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const std::vector<double> ls = log_softmax_rows(in[0], 1, nullptr, false);
    const int64_t n = in[0].shape[0], c = in[0].shape[1];
    double s = 0;
    for (int64_t r = 0; r < n; ++r) s -= ls[size_t(r * c + int64_t(in[1].v[size_t(r)]))];
    return spec_compare(ref_value(out.shape, {s / double(n)}), out);
  };
  auto ce_probs_spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const std::vector<double> ls = log_softmax_rows(in[0], 1, nullptr, false);
    const int64_t n = in[0].shape[0];
    double s = 0;
    for (size_t k = 0; k < ls.size(); ++k) s -= in[1].v[k] * ls[k];
    return spec_compare(ref_value(out.shape, {s / double(n)}), out);
  };
  auto ce = [](Context&, X x) { return cross_entropy(x[0], x[1]); };
  const Input labels = in_i32("labels", {N}, gen::integers(0, C - 1));
  Case a = make_case("cross_entropy_labels", {},
                     {in("logits", {N, C}, gen::uniform(-3, 3)), labels}, ce, true);
  a.spec = ce_labels_spec;
  cs.push_back(a);
  Case b = make_case("cross_entropy_labels_transposed", {},
                     {with(in("logits", {N, C}), Layout::transposed), labels}, ce, true);
  b.spec = ce_labels_spec;
  cs.push_back(b);
  // Probabilities as targets: the target gets a gradient too (as in PyTorch).
  Case p = make_case(
      "cross_entropy_probs", {},
      {in("logits", {N, C}, gen::uniform(-3, 3)), in("probs", {N, C}, gen::prob_rows())}, ce, true);
  p.spec = ce_probs_spec;
  cs.push_back(p);
  Case pc =
      make_case("cross_entropy_probs_const", {},
                {in("logits", {N, C}),
                 constant(with(in("probs", {N, C}, gen::uniform(0, 0.4)), Layout::transposed))},
                ce, true);
  pc.spec = ce_probs_spec;
  cs.push_back(pc);

  auto mse_spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    double s = 0;
    for (size_t k = 0; k < in[0].v.size(); ++k)
      s += (in[0].v[k] - in[1].v[k]) * (in[0].v[k] - in[1].v[k]);
    return spec_compare(ref_value(out.shape, {s / double(in[0].v.size())}), out);
  };
  auto mse = [](Context&, X x) { return mse_loss(x[0], x[1]); };
  Case m = make_case("mse_loss", {}, {in("a", {N, C}), in("b", {N, C})}, mse, true);
  m.spec = mse_spec;
  cs.push_back(m);
  Case ms = make_case(
      "mse_loss_strided", {},
      {with(in("a", {N, C}), Layout::transposed), with(in("b", {N, C}), Layout::narrowed)}, mse,
      true);
  ms.spec = mse_spec;
  cs.push_back(ms);

  auto one_hot_spec = [](int64_t classes) {
    return [classes](const std::vector<RefValue>& in, const RefValue& out) {
      Shape s = in[0].shape;
      s.push_back(classes);
      RefValue w = ref_value(s, std::vector<double>(size_t(s.numel()), 0.0));
      for (size_t k = 0; k < in[0].v.size(); ++k) w.v[k * size_t(classes) + size_t(in[0].v[k])] = 1;
      return spec_compare(w, out);
    };
  };
  Case oh = make_case(
      "one_hot", {Op::ONE_HOT}, {in_i32("labels", {N}, gen::integers(0, 3))},
      [](Context&, X x) { return one_hot(x[0], 4); }, false);
  oh.tol = {0, 0};
  oh.spec = one_hot_spec(4);
  cs.push_back(oh);
  Case oh2 = make_case(
      "one_hot_2d_strided", {Op::ONE_HOT},
      {with(in_i32("labels", {2, z(3, 256)}, gen::integers(0, 4)), Layout::transposed)},
      [](Context&, X x) { return one_hot(x[0], 5); }, false);
  oh2.tol = {0, 0};
  oh2.spec = one_hot_spec(5);
  cs.push_back(oh2);
}

// (x - mean) / sqrt(var + eps) [* w] [+ b] over the last dim, biased variance;
// rms: x / sqrt(mean(x^2) + eps) [* w].
SpecFn norm_spec(bool rms, bool has_w, bool has_b, double eps) {
  return [=](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int64_t D = x.shape[x.shape.ndim() - 1];
    RefValue w = x;
    for (size_t r0 = 0; r0 < x.v.size(); r0 += size_t(D)) {
      double mean = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) mean += x.v[r0 + size_t(d)] / double(D);
      if (rms) mean = 0;
      for (int64_t d = 0; d < D; ++d)
        var += (x.v[r0 + size_t(d)] - mean) * (x.v[r0 + size_t(d)] - mean) / double(D);
      for (int64_t d = 0; d < D; ++d) {
        double v = (x.v[r0 + size_t(d)] - mean) / std::sqrt(var + eps);
        if (has_w) v *= in[1].v[size_t(d)];
        if (has_b) v += in[has_w ? 2 : 1].v[size_t(d)];
        w.v[r0 + size_t(d)] = v;
      }
    }
    return spec_compare(w, out);
  };
}

void add_norms(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 512), D = z(37, 1024);
  const Gen wg = gen::uniform(0.5, 1.5);
  const double e5 = double(1e-5f), e6 = double(1e-6f);
  struct Nm {
    const char* name;
    std::vector<Input> ins;
    bool rms, w, b;
    float eps;
  };
  const Nm nms[] = {
      {"layer_norm", {in("x", {R, D}, gen::uniform(-2, 2))}, false, false, false, 0},
      {"layer_norm_affine",
       {in("x", {R, D}), in("w", {D}, wg), in("b", {D})},
       false,
       true,
       true,
       0},
      {"layer_norm_weight_only", {in("x", {R, D}), in("w", {D}, wg)}, false, true, false, 0},
      {"layer_norm_3d_transposed_eps",
       {with(in("x", {2, R, D}), Layout::transposed), in("w", {D}, wg), in("b", {D})},
       false,
       true,
       true,
       1e-2f},
      {"rms_norm", {in("x", {R, D}, gen::uniform(-2, 2))}, true, false, false, 0},
      {"rms_norm_weight", {in("x", {R, D}), in("w", {D}, wg)}, true, true, false, 0},
      {"rms_norm_3d_narrowed_eps",
       {with(in("x", {2, R, D}), Layout::narrowed), in("w", {D}, wg)},
       true,
       true,
       false,
       1e-2f},
  };
  for (const Nm& n : nms) {
    const bool rms = n.rms, hw = n.w, hb = n.b;
    const float eps = n.eps;
    auto build = [=](Context&, X x) {
      Tensor w = hw ? x[1] : Tensor(), b = hb ? x[2] : Tensor();
      if (rms) return eps > 0 ? rms_norm(x[0], w, eps) : rms_norm(x[0], w);
      return eps > 0 ? layer_norm(x[0], w, b, eps) : layer_norm(x[0], w, b);
    };
    Case c = make_case(n.name, {}, n.ins, build, true);
    c.spec = norm_spec(rms, hw, hb, eps > 0 ? double(eps) : rms ? e6 : e5);
    cs.push_back(c);
  }
}

}  // namespace

void add_nn_cases(std::vector<Case>& cs, Sz z) {
  add_softmax(cs, z);
  add_losses(cs, z);
  add_norms(cs, z);
}

}  // namespace kiln::test
