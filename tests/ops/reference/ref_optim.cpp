// Reference: optimizer steps (in place on the param, rewriting the state).
#include <cmath>
#include <string>
#include <vector>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

// The step's values (kiln/ext/op_params.h) from the last source.
template <class H>
H hyper(const RefArgs& a) {
  const RefValue& hp = a.in(a.n_src - 1);
  if (hp.numel() != hyper_floats<H>)
    ref_fail(a.node,
             "hp must have " + std::to_string(hyper_floats<H>) + " values, has " + hp.shape.str());
  std::vector<float> v(hp.v.begin(), hp.v.end());  // f32 values held as double
  return hyper_from_values<H>(v.data());
}

void check_same(const RefArgs& a, const RefValue& x, const char* what) {
  if (!(x.shape == a.in(0).shape))
    ref_fail(a.node,
             std::string(what) + " is " + x.shape.str() + ", param is " + a.in(0).shape.str());
}

}  // namespace

RefValue ref_ADAMW_STEP(const RefArgs& a) {
  if (a.n_src != 5) ref_fail(a.node, "adamw_step has 5 sources");
  const RefValue &p = a.in(0), &g = a.in(1), &m0 = a.in(2), &v0 = a.in(3);
  check_same(a, g, "grad");
  check_same(a, m0, "m");
  check_same(a, v0, "v");
  const AdamWHyper h = hyper<AdamWHyper>(a);
  const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay,
               c1 = h.bias_correction1, c2 = h.bias_correction2, gs = h.grad_scale;
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

// Multi-tensor AdamW: ADAMW_STEP's formula on every segment (param offset,
// state offset, length, group) of the table, hp row `group`; the rest unchanged.
RefValue ref_ADAMW_STEP_MULTI(const RefArgs& a) {
  if (a.n_src != 6) ref_fail(a.node, "adamw_step_multi has 6 sources");
  const RefValue &p = a.in(0), &g = a.in(1), &hp = a.in(4), &segs = a.in(5);
  RefValue r = p, m = a.in(2), v = a.in(3);
  r.shape = a.node->shape;
  const int64_t nh = hyper_floats<AdamWHyper>, G = hp.shape[0];
  for (int64_t s = 0; s < segs.shape[0]; ++s) {
    const auto f = [&](int c) { return int64_t(segs.v[size_t(s * 4 + c)]); };
    const int64_t po = f(0), so = f(1), len = f(2), grp = f(3);
    if (po < 0 || so < 0 || len < 0 || po + len > p.numel() || so + len > g.numel() || grp < 0 ||
        grp >= G)
      ref_fail(a.node, "segment " + std::to_string(s) + " is out of bounds");
    std::vector<float> hv(static_cast<size_t>(nh));
    for (int64_t k = 0; k < nh; ++k) hv[size_t(k)] = float(hp.v[size_t(grp * nh + k)]);
    const AdamWHyper h = hyper_from_values<AdamWHyper>(hv.data());
    const double lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay,
                 c1 = h.bias_correction1, c2 = h.bias_correction2, gs = h.grad_scale;
    for (int64_t j = 0; j < len; ++j) {
      const size_t pk = size_t(po + j), k = size_t(so + j);
      const double gk = g.v[k] * gs;
      m.v[k] = b1 * m.v[k] + (1 - b1) * gk;
      v.v[k] = b2 * v.v[k] + (1 - b2) * gk * gk;
      r.v[pk] = p.v[pk] * (1 - lr * wd) - lr * (m.v[k] * c1) / (std::sqrt(v.v[k] * c2) + eps);
    }
  }
  a.writes.emplace_back(a.node->src[2], std::move(m));
  a.writes.emplace_back(a.node->src[3], std::move(v));
  return r;
}

// PyTorch's SGD; the momentum buffer (src 2) is optional.
RefValue ref_SGD_STEP(const RefArgs& a) {
  if (a.n_src != 3 && a.n_src != 4) ref_fail(a.node, "sgd_step has 3 or 4 sources");
  const RefValue &p = a.in(0), &g = a.in(1);
  check_same(a, g, "grad");
  const bool has_buf = a.n_src == 4;
  const SgdHyper h = hyper<SgdHyper>(a);
  const double lr = h.lr, mu = h.momentum, damp = h.dampening, wd = h.weight_decay,
               gs = h.grad_scale;
  const bool nesterov = h.nesterov != 0, first = h.first_step != 0;
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
