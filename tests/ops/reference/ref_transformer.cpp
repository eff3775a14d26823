// References of the fused transformer ops (LAYER_NORM*, ATTENTION*,
// CROSS_ENTROPY*), in double, written from their definitions in ops.def: plain
// loops over rows, the whole score matrix of a head, an explicit one-hot.
#include <algorithm>
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Norm {
  std::vector<double> xhat;  // row-major like x
  std::vector<double> rstd;  // per row
};

Norm normalise(const RefValue& x, double eps) {
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  Norm n{std::vector<double>(x.v.size()), std::vector<double>(size_t(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.v.data() + r * d;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xr[j];
    mean /= double(d);
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= double(d);
    const double rs = 1.0 / std::sqrt(var + eps);
    n.rstd[size_t(r)] = rs;
    for (int64_t j = 0; j < d; ++j) n.xhat[size_t(r * d + j)] = (xr[j] - mean) * rs;
  }
  return n;
}

// Softmax probabilities of one attention head: p[i][j] (0 for masked keys).
std::vector<double> head_probs(const double* q, const double* k, int64_t tq, int64_t tk, int64_t e,
                               double scale, bool causal) {
  std::vector<double> p(size_t(tq * tk), 0.0);
  for (int64_t i = 0; i < tq; ++i) {
    double m = -kInf;
    std::vector<double> s(size_t(tk), -kInf);
    for (int64_t j = 0; j < tk; ++j) {
      if (causal && j > i + (tk - tq)) continue;
      double acc = 0;
      for (int64_t c = 0; c < e; ++c) acc += q[i * e + c] * k[j * e + c];
      s[size_t(j)] = scale * acc;
      m = std::max(m, s[size_t(j)]);
    }
    if (m == -kInf) continue;  // no visible key: zeros
    double sum = 0;
    for (int64_t j = 0; j < tk; ++j) sum += s[size_t(j)] == -kInf ? 0 : std::exp(s[size_t(j)] - m);
    for (int64_t j = 0; j < tk; ++j)
      p[size_t(i * tk + j)] = s[size_t(j)] == -kInf ? 0 : std::exp(s[size_t(j)] - m) / sum;
  }
  return p;
}

struct AttnDims {
  int64_t heads, tq, tk, e;
};
AttnDims attn_dims(const RefValue& q, const RefValue& k) {
  const int nd = q.shape.ndim();
  const int64_t tq = q.shape[nd - 2], e = q.shape[nd - 1];
  return {tq * e ? q.numel() / (tq * e) : 0, tq, k.shape[nd - 2], e};
}

std::vector<double> log_softmax_row(const double* x, int64_t c) {
  double m = -kInf, s = 0;
  for (int64_t j = 0; j < c; ++j) m = std::max(m, x[j]);
  for (int64_t j = 0; j < c; ++j) s += std::exp(x[j] - m);
  std::vector<double> r(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) r[size_t(j)] = x[j] - m - std::log(s);
  return r;
}

}  // namespace

RefValue ref_LAYER_NORM(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const LayerNormParams p = a.params<LayerNormParams>();
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1];
  int i = 1;
  const RefValue* w = p.has_weight ? &a.in(i++) : nullptr;
  const RefValue* b = p.has_bias ? &a.in(i++) : nullptr;
  for (size_t k = 0; k < r.v.size(); ++k) {
    const size_t j = k % size_t(d);
    r.v[k] = n.xhat[k] * (w ? w->v[j] : 1.0) + (b ? b->v[j] : 0.0);
  }
  return r;
}

// dx = rstd * (g - mean(g) - xhat * mean(g xhat)), g = dy * w.
RefValue ref_LAYER_NORM_BACK(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const LayerNormParams p = a.params<LayerNormParams>();
  const RefValue* w = p.has_weight ? &a.in(2) : nullptr;
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  for (int64_t row = 0; row < rows; ++row) {
    double sg = 0, sgx = 0;
    std::vector<double> g(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      g[size_t(j)] = dy.v[k] * (w ? w->v[size_t(j)] : 1.0);
      sg += g[size_t(j)];
      sgx += g[size_t(j)] * n.xhat[k];
    }
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      r.v[k] = n.rstd[size_t(row)] * (g[size_t(j)] - sg / double(d) - n.xhat[k] * sgx / double(d));
    }
  }
  return r;
}

RefValue ref_LAYER_NORM_BACK_AFFINE(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const int64_t d = x.shape[x.shape.ndim() - 1];
  RefValue r = ref_out(a.node, Shape{2, d});
  const Norm n = normalise(x, double(a.params<LayerNormParams>().eps));
  for (size_t k = 0; k < x.v.size(); ++k) {
    r.v[k % size_t(d)] += dy.v[k] * n.xhat[k];
    r.v[size_t(d) + k % size_t(d)] += dy.v[k];
  }
  return r;
}

RefValue ref_ATTENTION(const RefArgs& a) {
  const RefValue &q = a.in(0), &k = a.in(1), &v = a.in(2);
  const AttentionParams p = a.params<AttentionParams>();
  RefValue r = ref_out(a.node, q.shape);
  const AttnDims D = attn_dims(q, k);
  for (int64_t h = 0; h < D.heads; ++h) {
    const double* qh = q.v.data() + h * D.tq * D.e;
    const double* kh = k.v.data() + h * D.tk * D.e;
    const double* vh = v.v.data() + h * D.tk * D.e;
    const std::vector<double> pr = head_probs(qh, kh, D.tq, D.tk, D.e, double(p.scale), p.causal);
    for (int64_t i = 0; i < D.tq; ++i)
      for (int64_t c = 0; c < D.e; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < D.tk; ++j) acc += pr[size_t(i * D.tk + j)] * vh[j * D.e + c];
        r.v[size_t((h * D.tq + i) * D.e + c)] = acc;
      }
  }
  return r;
}

// With P = softmax(S), S = scale q k^T (masked), O = P v and dO given:
// dv = P^T dO; dP = dO v^T; dS = P * (dP - rowsum(dP * P)); dq = scale dS k;
// dk = scale dS^T q. (rowsum(dP * P) = dO . O; the reference uses the former.)
RefValue ref_ATTENTION_BACK(const RefArgs& a) {
  const RefValue &q = a.in(0), &k = a.in(1), &v = a.in(2), &g = a.in(4);
  (void)a.in(3);  // the kernel's O; the reference derives everything from P
  const AttentionParams p = a.params<AttentionParams>();
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  RefValue r = ref_out(a.node, Shape{nq + nk + nv});
  const AttnDims D = attn_dims(q, k);
  const double sc = double(p.scale);
  for (int64_t h = 0; h < D.heads; ++h) {
    const double* qh = q.v.data() + h * D.tq * D.e;
    const double* kh = k.v.data() + h * D.tk * D.e;
    const double* vh = v.v.data() + h * D.tk * D.e;
    const double* gh = g.v.data() + h * D.tq * D.e;
    double* dq = r.v.data() + h * D.tq * D.e;
    double* dk = r.v.data() + nq + h * D.tk * D.e;
    double* dv = r.v.data() + nq + nk + h * D.tk * D.e;
    const std::vector<double> pr = head_probs(qh, kh, D.tq, D.tk, D.e, sc, p.causal);
    for (int64_t i = 0; i < D.tq; ++i) {
      std::vector<double> dp(size_t(D.tk));
      double row = 0;
      for (int64_t j = 0; j < D.tk; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < D.e; ++c) acc += gh[i * D.e + c] * vh[j * D.e + c];
        dp[size_t(j)] = acc;
        row += acc * pr[size_t(i * D.tk + j)];
      }
      for (int64_t j = 0; j < D.tk; ++j) {
        const double pij = pr[size_t(i * D.tk + j)];
        const double ds = pij * (dp[size_t(j)] - row);
        for (int64_t c = 0; c < D.e; ++c) {
          dq[i * D.e + c] += sc * ds * kh[j * D.e + c];
          dk[j * D.e + c] += sc * ds * qh[i * D.e + c];
          dv[j * D.e + c] += pij * gh[i * D.e + c];
        }
      }
    }
  }
  return r;
}

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
