// Reference: optimizer steps (in place on the param, rewriting the state).
#include <cmath>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

const RefValue& hyper(const RefArgs& a) {
  const RefValue& hp = a.in(a.n_src - 1);
  if (hp.numel() != 8) ref_fail(a.node, "hp must have 8 values, has " + hp.shape.str());
  return hp;
}

void check_same(const RefArgs& a, const RefValue& x, const char* what) {
  if (!(x.shape == a.in(0).shape))
    ref_fail(a.node,
             std::string(what) + " is " + x.shape.str() + ", param is " + a.in(0).shape.str());
}

}  // namespace

// hp = lr, beta1, beta2, eps, weight_decay, 1/(1-beta1^t), 1/(1-beta2^t), gscale.
RefValue ref_ADAMW_STEP(const RefArgs& a) {
  if (a.n_src != 5) ref_fail(a.node, "adamw_step has 5 sources");
  const RefValue &p = a.in(0), &g = a.in(1), &m0 = a.in(2), &v0 = a.in(3);
  check_same(a, g, "grad");
  check_same(a, m0, "m");
  check_same(a, v0, "v");
  const std::vector<double>& h = hyper(a).v;
  const double lr = h[0], b1 = h[1], b2 = h[2], eps = h[3], wd = h[4], c1 = h[5], c2 = h[6],
               gs = h[7];
  RefValue r = ref_out(a.node, p.shape), m = m0, v = v0;
  for (size_t k = 0; k < r.v.size(); ++k) {
    const double gk = g.v[k] * gs;
    m.v[k] = b1 * m0.v[k] + (1 - b1) * gk;
    v.v[k] = b2 * v0.v[k] + (1 - b2) * gk * gk;
    r.v[k] = p.v[k] * (1 - lr * wd) - lr * (m.v[k] * c1) / (std::sqrt(v.v[k] * c2) + eps);
  }
  a.writes.emplace_back(a.node->src[2], std::move(m));
  a.writes.emplace_back(a.node->src[3], std::move(v));
  return r;
}

// hp = lr, momentum, dampening, nesterov, weight_decay, first, -, gscale
// (PyTorch's SGD); the momentum buffer (src 2) is optional.
RefValue ref_SGD_STEP(const RefArgs& a) {
  if (a.n_src != 3 && a.n_src != 4) ref_fail(a.node, "sgd_step has 3 or 4 sources");
  const RefValue &p = a.in(0), &g = a.in(1);
  check_same(a, g, "grad");
  const bool has_buf = a.n_src == 4;
  const std::vector<double>& h = hyper(a).v;
  const double lr = h[0], mu = h[1], damp = h[2], wd = h[4], gs = h[7];
  const bool nesterov = h[3] != 0, first = h[5] != 0;
  RefValue r = ref_out(a.node, p.shape);
  RefValue buf = has_buf ? a.in(2) : RefValue();
  if (has_buf) check_same(a, buf, "buf");
  for (size_t k = 0; k < r.v.size(); ++k) {
    double gk = g.v[k] * gs + wd * p.v[k];
    if (has_buf) {
      buf.v[k] = first ? gk : mu * buf.v[k] + (1 - damp) * gk;
      gk = nesterov ? gk + mu * buf.v[k] : buf.v[k];
    }
    r.v[k] = p.v[k] - lr * gk;
  }
  if (has_buf) a.writes.emplace_back(a.node->src[2], std::move(buf));
  return r;
}

}  // namespace kiln::test
