// Cases: the fused CROSS_ENTROPY (-inf logits) and CROSS_ENTROPY_BACK on its own,
// and the loss builders checked against independent specs (cross-entropy with
// labels and with probabilities, MSE).
#include <cmath>
#include <limits>

#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

void add_cross_entropy(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(6, 768), C = z(37, 256);
  auto ce = [](Context&, X x) { return cross_entropy(x[0], x[1]); };
  const Input labels = in_i32("labels", {N}, gen::integers(0, C - 1));
  cs.push_back(make_case("cross_entropy_fused", {Op::CROSS_ENTROPY},
                         {in("logits", {N, C}, gen::uniform(-4, 4)), labels}, ce, true));
  cs.push_back(make_case("cross_entropy_fused_narrowed", {Op::CROSS_ENTROPY},
                         {with(in("logits", {N, C}), Layout::narrowed), labels}, ce, true));
  cs.push_back(make_case("cross_entropy_fused_c16", {Op::CROSS_ENTROPY},
                         {in("logits", {N, 16}), in_i32("labels", {N}, gen::integers(0, 15))}, ce,
                         true));
  // -inf in non-target logits (a masked vocabulary): the loss stays finite. Every
  // row is 0.5, -inf, -1, 2, -inf, 0.25 and the labels pick 0, 2, 3 or 5.
  Case inf =
      make_case("cross_entropy_neg_inf_logits", {Op::CROSS_ENTROPY},
                {constant(in("logits", {4, 6}, gen::values({0.5, -kInf, -1, 2, -kInf, 0.25}))),
                 in_i32("labels", {4}, gen::values({0, 2, 3, 5}))},
                ce, false);
  inf.spec = [](const std::vector<RefValue>&, const RefValue& out) {
    return std::isfinite(out.v[0]) ? std::string() : "loss is not finite";
  };
  cs.push_back(inf);
  const int64_t NM = z(700, 3072);
  cs.push_back(no_fd(make_case(
      "cross_entropy_fused_mt", {Op::CROSS_ENTROPY},
      {in("logits", {NM, 256}, gen::uniform(-3, 3)), in_i32("labels", {NM}, gen::integers(0, 255))},
      ce, true)));
  // CROSS_ENTROPY_BACK alone; the incoming gradient is a computed scalar.
  cs.push_back(make_case(
      "cross_entropy_back", {Op::CROSS_ENTROPY_BACK},
      {in("logits", {N, C}, gen::uniform(-3, 3)), labels, in("g", {2})},
      [](Context&, X x) {
        return detail::make_op(Op::CROSS_ENTROPY_BACK, DType::f32, x[0].shape(),
                               {x[0], x[1], sum(x[2])});
      },
      false));
}

// The masked form (ignore_index, per-row weights): the reference evaluates the
// definition in ops.def; the specs check the semantics from scratch.
void add_masked_cross_entropy(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(7, 768), C = z(37, 256);
  // Every third label ignored, the rest in range.
  const Input labels = in_i32("labels", {N}, gen::values({3, kIgnoreIndex, 0, 7, 1, kIgnoreIndex}));
  const Input weights = constant(in("w", {N}, gen::uniform(0.1, 2)));
  auto ignore = [](Context&, X x) {
    return cross_entropy(x[0], x[1], {.ignore_index = kIgnoreIndex});
  };
  auto weighted = [](Context&, X x) {
    return cross_entropy(x[0], x[1], {.ignore_index = kIgnoreIndex, .weight = x[2]});
  };
  auto weight_only = [](Context&, X x) { return cross_entropy(x[0], x[1], {.weight = x[2]}); };
  // sum(w * loss) / sum(w) over the labels that are not -100, from log_softmax.
  auto spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const std::vector<double> ls = log_softmax_rows(in[0], 1, nullptr, false);
    const int64_t n = in[0].shape[0], c = in[0].shape[1];
    double s = 0, d = 0;
    for (int64_t r = 0; r < n; ++r) {
      const int64_t t = int64_t(in[1].v[size_t(r)]);
      if (t == kIgnoreIndex) continue;
      const double w = in.size() > 2 ? in[2].v[size_t(r)] : 1.0;
      s -= w * ls[size_t(r * c + t)];
      d += w;
    }
    return spec_compare(ref_value(out.shape, {d == 0 ? 0.0 : s / d}), out);
  };
  Case a = make_case("cross_entropy_ignore_index", {Op::CROSS_ENTROPY},
                     {in("logits", {N, C}, gen::uniform(-4, 4)), labels}, ignore, true);
  a.spec = spec;
  cs.push_back(a);
  Case b =
      make_case("cross_entropy_weighted_ignore", {Op::CROSS_ENTROPY},
                {with(in("logits", {N, C}), Layout::narrowed), labels, weights}, weighted, true);
  b.spec = spec;
  cs.push_back(b);
  Case w = make_case("cross_entropy_weighted", {Op::CROSS_ENTROPY},
                     {in("logits", {N, C}, gen::uniform(-3, 3)),
                      in_i32("labels", {N}, gen::integers(0, C - 1)), weights},
                     weight_only, true);
  w.spec = spec;
  cs.push_back(w);
  // Nothing counts: every label ignored. The loss is 0 and so is the gradient
  // (PyTorch gives NaN; kiln/ops.h says why not), whatever the logits hold.
  Case none = make_case("cross_entropy_all_ignored", {Op::CROSS_ENTROPY},
                        {in("logits", {4, 6}, gen::values({0.5, kInf, -1, 2, -kInf, 0.25})),
                         in_i32("labels", {4}, gen::values({kIgnoreIndex}))},
                        ignore, false);
  none.spec = [](const std::vector<RefValue>&, const RefValue& out) {
    return out.v[0] == 0.0 ? std::string() : "the loss of no counted row is not 0";
  };
  cs.push_back(none);
  const int64_t NM = z(700, 3072);
  cs.push_back(no_fd(make_case("cross_entropy_weighted_mt", {Op::CROSS_ENTROPY},
                               {in("logits", {NM, 256}, gen::uniform(-3, 3)),
                                in_i32("labels", {NM}, gen::values({5, kIgnoreIndex, 200, 0, 255})),
                                constant(in("w", {NM}, gen::uniform(0, 1)))},
                               weighted, true)));
  // CROSS_ENTROPY_BACK alone, masked and weighted, and with every row ignored.
  CrossEntropyParams p;
  p.ignore = p.has_weight = true;
  cs.push_back(make_case(
      "cross_entropy_back_weighted", {Op::CROSS_ENTROPY_BACK},
      {in("logits", {N, C}, gen::uniform(-3, 3)), labels, in("g", {2}), weights},
      [p](Context&, X x) {
        return detail::make_op(Op::CROSS_ENTROPY_BACK, DType::f32, x[0].shape(),
                               {x[0], x[1], sum(x[2]), x[3]}, p);
      },
      false));
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
}
}  // namespace

void add_loss_cases(std::vector<Case>& cs, Sz z) {
  add_cross_entropy(cs, z);
  add_masked_cross_entropy(cs, z);
  add_losses(cs, z);
}

}  // namespace kiln::test
