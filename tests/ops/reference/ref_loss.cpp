// Reference: CROSS_ENTROPY and CROSS_ENTROPY_BACK, in double, written from their
// definitions in ops.def: plain loops over rows, an explicit one-hot.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<double> log_softmax_row(const double* x, int64_t c) {
  double m = -kInf, s = 0;
  for (int64_t j = 0; j < c; ++j) m = std::max(m, x[j]);
  for (int64_t j = 0; j < c; ++j) s += std::exp(x[j] - m);
  std::vector<double> r(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) r[size_t(j)] = x[j] - m - std::log(s);
  return r;
}

}  // namespace

RefValue ref_CROSS_ENTROPY(const RefArgs& a) {
  const RefValue &x = a.in(0), &lab = a.in(1);
  RefValue r = ref_out(a.node, Shape{});
  const int64_t n = x.shape[0], c = x.shape[1];
  double s = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t t = int64_t(lab.v[size_t(i)]);
    if (t < 0 || t >= c) ref_fail(a.node, "label out of range");
    s -= log_softmax_row(x.v.data() + i * c, c)[size_t(t)];
  }
  r.v[0] = s / double(n);
  return r;
}

RefValue ref_CROSS_ENTROPY_BACK(const RefArgs& a) {
  const RefValue &x = a.in(0), &lab = a.in(1), &g = a.in(2);
  RefValue r = ref_out(a.node, x.shape);
  const int64_t n = x.shape[0], c = x.shape[1];
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<double> ls = log_softmax_row(x.v.data() + i * c, c);
    for (int64_t j = 0; j < c; ++j) {
      const double onehot = j == int64_t(lab.v[size_t(i)]) ? 1.0 : 0.0;
      r.v[size_t(i * c + j)] = (std::exp(ls[size_t(j)]) - onehot) * g.v[0] / double(n);
    }
  }
  return r;
}

}  // namespace kiln::test
