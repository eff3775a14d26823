// Helpers shared by several case files: independent double-precision specs and
// small case tweaks.
#pragma once
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "ops/harness/case.h"

namespace kiln::test {

inline constexpr double kInf = std::numeric_limits<double>::infinity();

// A large case: grad mode compares the CPU's gradients with the reference's only.
inline Case no_fd(Case c) {
  c.fd = false;
  return c;
}

inline  // log-softmax of each last-dim row of (scale*x + mask) with the causal rule,
        // written independently of the reference (PyTorch semantics).
    std::vector<double>
    log_softmax_rows(const RefValue& x, double scale, const RefValue* mask, bool causal) {
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

// A 2-D window (conv and pooling specs) and its output size (PyTorch, floor).
struct Win {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
};

inline int64_t osz(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

}  // namespace kiln::test
