// Reference: CROSS_ENTROPY and CROSS_ENTROPY_BACK, in double, written from their
// definitions in ops.def: plain loops over rows, an explicit one-hot.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

constexpr double kLossInf = std::numeric_limits<double>::infinity();

std::vector<double> log_softmax_row(const double* x, int64_t c) {
  double m = -kLossInf, s = 0;
  for (int64_t j = 0; j < c; ++j) m = std::max(m, x[j]);
  for (int64_t j = 0; j < c; ++j) s += std::exp(x[j] - m);
  std::vector<double> r(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) r[size_t(j)] = x[j] - m - std::log(s);
  return r;
}

// Row i's weight in the mean: 1 unmasked; masked, 0 for an ignored label, else
// the weight (1 without weights). Sources: logits, labels, [d loss,] weights.
std::vector<double> row_weights(const RefArgs& a, int weight_src) {
  const CrossEntropyParams p = a.params<CrossEntropyParams>();
  const RefValue& lab = a.in(1);
  std::vector<double> w(lab.v.size(), 1.0);
  for (size_t i = 0; i < w.size(); ++i) {
    if (p.ignore && int64_t(lab.v[i]) == p.ignore_index) w[i] = 0;
    else if (p.has_weight) w[i] = a.in(weight_src).v[i];
  }
  return w;
}

// The mean's denominator: N unmasked, sum(w) masked (0: nothing counts).
double denominator(const RefArgs& a, const std::vector<double>& w) {
  if (!a.params<CrossEntropyParams>().masked()) return double(w.size());
  double d = 0;
  for (double v : w) d += v;
  return d;
}

}  // namespace

RefValue ref_CROSS_ENTROPY(const RefArgs& a) {
  const RefValue &x = a.in(0), &lab = a.in(1);
  RefValue r = ref_out(a.node, Shape{});
  const int64_t n = x.shape[0], c = x.shape[1];
  const std::vector<double> w = row_weights(a, 2);
  const bool masked = a.params<CrossEntropyParams>().masked();
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = int64_t(lab.v[size_t(i)]);
    if (masked && w[size_t(i)] == 0) continue;  // ignored, or weight 0
    if (t < 0 || t >= c) ref_fail(a.node, "label out of range");
    s -= w[size_t(i)] * log_softmax_row(x.v.data() + i * c, c)[size_t(t)];
  }
  const double d = denominator(a, w);
  r.v[0] = masked && d == 0 ? 0.0 : s / d;
  return r;
}

RefValue ref_CROSS_ENTROPY_BACK(const RefArgs& a) {
  const RefValue &x = a.in(0), &lab = a.in(1), &g = a.in(2);
  RefValue r = ref_out(a.node, x.shape);
  const int64_t n = x.shape[0], c = x.shape[1];
  const std::vector<double> w = row_weights(a, 3);
  const double d = denominator(a, w);
  for (int64_t i = 0; i < n; ++i) {
    if (w[size_t(i)] == 0 || d == 0) continue;  // stays 0
    const std::vector<double> ls = log_softmax_row(x.v.data() + i * c, c);
    for (int64_t j = 0; j < c; ++j) {
      const double onehot = j == int64_t(lab.v[size_t(i)]) ? 1.0 : 0.0;
      r.v[size_t(i * c + j)] = (std::exp(ls[size_t(j)]) - onehot) * g.v[0] * w[size_t(i)] / d;
    }
  }
  return r;
}

}  // namespace kiln::test
