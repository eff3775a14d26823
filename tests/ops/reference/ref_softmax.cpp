// Reference: softmax and log_softmax.
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

constexpr double kSoftmaxInf = std::numeric_limits<double>::infinity();

// softmax / log_softmax over the last axis of scale*x (+ mask) with the causal rule.
RefValue softmax_like(const RefArgs& a, bool log) {
  const RefValue& x = a.in(0);
  const RefValue* mask = a.n_src > 1 && a.src[1] ? a.src[1] : nullptr;
  const SoftmaxParams prm = a.params<SoftmaxParams>();
  const double scale = prm.scale;
  const bool causal = prm.causal;
  const Shape& s = x.shape;
  const int nd = s.ndim();
  if (nd < 1) ref_fail(a.node, "softmax needs 1+ dims");
  if (mask) {
    const Shape b = ref_bcast_shape(a.node, s, mask->shape);
    if (!(b == s))
      ref_fail(a.node, "mask " + mask->shape.str() + " does not broadcast to " + s.str());
  }
  RefValue r = ref_out(a.node, s);
  const int64_t C = s[nd - 1];
  const int64_t R = nd >= 2 ? s[nd - 2] : 1;
  std::vector<double> z(static_cast<size_t>(C));
  for (int64_t row = 0; row < x.numel() / C; ++row) {
    // Multi-index of the row's first element.
    int64_t idx[kMaxDims] = {};
    int64_t rest = row;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rest % s[d];
      rest /= s[d];
    }
    const int64_t rr = nd >= 2 ? idx[nd - 2] : 0;
    double m = -kSoftmaxInf;
    for (int64_t c = 0; c < C; ++c) {
      idx[nd - 1] = c;
      double v = scale * x.v[size_t(row * C + c)];
      if (mask) v += ref_bcast_at(*mask, idx, nd);
      if (causal && c > rr + (C - R)) v = -kSoftmaxInf;
      z[size_t(c)] = v;
      m = std::max(m, v);
    }
    double sum = 0;
    for (int64_t c = 0; c < C; ++c) sum += std::exp(z[size_t(c)] - m);
    for (int64_t c = 0; c < C; ++c) {
      const double e = z[size_t(c)] - m;
      r.v[size_t(row * C + c)] = log ? e - std::log(sum) : std::exp(e) / sum;
    }
  }
  return r;
}

}  // namespace

RefValue ref_SOFTMAX(const RefArgs& a) { return softmax_like(a, false); }
RefValue ref_LOG_SOFTMAX(const RefArgs& a) { return softmax_like(a, true); }

}  // namespace kiln::test
