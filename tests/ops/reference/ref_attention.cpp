// Reference: the fused ATTENTION and ATTENTION_BACK, in double, written from
// their definitions in ops.def: the whole score matrix of a head (segment ids
// compared pairwise, not as the kernels' ranges); ROPE and
// ROPE_BACK element by element.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kiln/ext/rng.h"
#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

constexpr double kAttentionInf = std::numeric_limits<double>::infinity();

// Whether query i and key j lie in one run of equal segment ids (seg: the
// head's row of ids, T of them; null: no segments).
bool same_run(const double* seg, int64_t i, int64_t j) {
  if (!seg) return true;
  for (int64_t t = std::min(i, j); t < std::max(i, j); ++t)
    if (seg[t] != seg[t + 1]) return false;
  return true;
}

// Softmax probabilities of one attention head: p[i][j] (0 for masked keys).
std::vector<double> head_probs(const double* q, const double* k, int64_t tq, int64_t tk, int64_t e,
                               double scale, bool causal, const double* seg) {
  std::vector<double> p(size_t(tq * tk), 0.0);
  for (int64_t i = 0; i < tq; ++i) {
    double m = -kAttentionInf;
    std::vector<double> s(size_t(tk), -kAttentionInf);
    for (int64_t j = 0; j < tk; ++j) {
      if (causal && j > i + (tk - tq)) continue;
      if (!same_run(seg, i, j)) continue;
      double acc = 0;
      for (int64_t c = 0; c < e; ++c) acc += q[i * e + c] * k[j * e + c];
      s[size_t(j)] = scale * acc;
      m = std::max(m, s[size_t(j)]);
    }
    if (m == -kAttentionInf) continue;  // no visible key: zeros
    double sum = 0;
    for (int64_t j = 0; j < tk; ++j)
      sum += s[size_t(j)] == -kAttentionInf ? 0 : std::exp(s[size_t(j)] - m);
    for (int64_t j = 0; j < tk; ++j)
      p[size_t(i * tk + j)] = s[size_t(j)] == -kAttentionInf ? 0 : std::exp(s[size_t(j)] - m) / sum;
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

// Head h's row of segment ids (the source before the seed tensor, or the
// last one, when segmented), or null.
const double* head_segments(const RefArgs& a, const AttnDims& D, int64_t h) {
  const AttentionParams p = a.params<AttentionParams>();
  if (!p.segmented) return nullptr;
  const RefValue& seg = a.in(a.node->n_src - (p.seeded ? 2 : 1));
  const int64_t rows = seg.shape[0], t = seg.shape[1];
  if (t != D.tq || t != D.tk || D.heads % rows != 0)
    ref_fail(a.node, "segments " + seg.shape.str() + " do not fit the heads");
  return seg.v.data() + h / (D.heads / rows) * t;
}

// ATTENTION_BACK's result shaped like the one tensor its q, k and v are
// slices of (views of one memory): each gradient element goes where its
// source's element is, counted from the lowest of the three offsets. g holds
// dq, dk, dv one after the other; every element of the result must be
// covered once.
RefValue placed_in_sliced(const TensorNode* node, const std::vector<double>& g) {
  RefValue r = ref_out(node);
  std::vector<int> hits(r.v.size(), 0);
  const TensorNode *q = node->src[0], *k = node->src[1], *v = node->src[2];
  if (!q->view_src || k->view_src != q->view_src || v->view_src != q->view_src)
    ref_fail(node, "a result shaped " + node->shape.str() + " needs q, k, v views of one tensor");
  const size_t base = std::min({q->view_offs, k->view_offs, v->view_offs});
  size_t from = 0;
  for (const TensorNode* s : {q, k, v}) {
    const int64_t es = int64_t(dtype_size(s->dtype));
    Index it(s->shape);
    do {
      int64_t off = int64_t(s->view_offs - base) / es;
      for (int d = 0; d < s->shape.ndim(); ++d) off += it.i[d] * (s->stride[size_t(d)] / es);
      if (off < 0 || off >= int64_t(r.v.size())) ref_fail(node, "a gradient falls outside");
      r.v[size_t(off)] = g[from++];
      ++hits[size_t(off)];
    } while (it.next());
  }
  for (int h : hits)
    if (h != 1) ref_fail(node, "q, k and v do not tile the result once");
  return r;
}

// Dropout's factor of weight (i, j) of head h, by the definition in ops.h:
// dropout()'s mask of the [..., Tq, Tk] weights (kiln/ext/rng.h, element
// (h Tq + i) Tk + j, seed xor the seed tensor's element 0), kept ones scaled
// by 1 / keep; 1 without dropout.
struct RefDropout {
  bool on = false;
  uint64_t seed = 0;
  double keep = 1;
  explicit RefDropout(const RefArgs& a) {
    const AttentionParams p = a.params<AttentionParams>();
    on = p.keep < 1.0f;
    keep = double(p.keep);
    seed = uint64_t(p.seed);
    if (on && p.seeded) seed ^= uint64_t(int64_t(a.in(a.node->n_src - 1).v.at(0)));
  }
  double factor(const AttnDims& D, int64_t h, int64_t i, int64_t j) const {
    if (!on) return 1.0;
    const uint64_t index = uint64_t((h * D.tq + i) * D.tk + j);
    return detail::rng_uniform(seed, index) < float(keep) ? 1.0 / double(float(keep)) : 0.0;
  }
};

}  // namespace

RefValue ref_ATTENTION(const RefArgs& a) {
  const RefValue &q = a.in(0), &k = a.in(1), &v = a.in(2);
  const AttentionParams p = a.params<AttentionParams>();
  RefValue r = ref_out(a.node, q.shape);
  const AttnDims D = attn_dims(q, k);
  const RefDropout drop(a);
  for (int64_t h = 0; h < D.heads; ++h) {
    const double* qh = q.v.data() + h * D.tq * D.e;
    const double* kh = k.v.data() + h * D.tk * D.e;
    const double* vh = v.v.data() + h * D.tk * D.e;
    const std::vector<double> pr =
        head_probs(qh, kh, D.tq, D.tk, D.e, double(p.scale), p.causal, head_segments(a, D, h));
    for (int64_t i = 0; i < D.tq; ++i)
      for (int64_t c = 0; c < D.e; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < D.tk; ++j)
          acc += pr[size_t(i * D.tk + j)] * drop.factor(D, h, i, j) * vh[j * D.e + c];
        r.v[size_t((h * D.tq + i) * D.e + c)] = acc;
      }
  }
  return r;
}

// With P = softmax(S), S = scale q k^T (masked), W = P * F (F dropout's
// factors, 1 without), O = W v and dO given: dv = W^T dO; dW = dO v^T,
// dP = dW * F; dS = P * (dP - rowsum(dP * P)); dq = scale dS k;
// dk = scale dS^T q. (rowsum(dP * P) = dO . O; the reference uses the former.)
RefValue ref_ATTENTION_BACK(const RefArgs& a) {
  const RefValue &q = a.in(0), &k = a.in(1), &v = a.in(2), &g = a.in(4);
  (void)a.in(3);  // the kernel's O; the reference derives everything from P
  const AttentionParams p = a.params<AttentionParams>();
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  // dq, dk, dv one after the other; placed in the tensor the three slice
  // below when the result has its shape.
  const bool flat = a.node->shape.ndim() == 1;
  if (flat) ref_check_shape(a.node, Shape{nq + nk + nv});
  std::vector<double> grads(size_t(nq + nk + nv), 0.0);
  const AttnDims D = attn_dims(q, k);
  const double sc = double(p.scale);
  const RefDropout drop(a);
  for (int64_t h = 0; h < D.heads; ++h) {
    const double* qh = q.v.data() + h * D.tq * D.e;
    const double* kh = k.v.data() + h * D.tk * D.e;
    const double* vh = v.v.data() + h * D.tk * D.e;
    const double* gh = g.v.data() + h * D.tq * D.e;
    double* dq = grads.data() + h * D.tq * D.e;
    double* dk = grads.data() + nq + h * D.tk * D.e;
    double* dv = grads.data() + nq + nk + h * D.tk * D.e;
    const std::vector<double> pr =
        head_probs(qh, kh, D.tq, D.tk, D.e, sc, p.causal, head_segments(a, D, h));
    for (int64_t i = 0; i < D.tq; ++i) {
      std::vector<double> dp(size_t(D.tk));
      double row = 0;
      for (int64_t j = 0; j < D.tk; ++j) {
        double acc = 0;
        for (int64_t c = 0; c < D.e; ++c) acc += gh[i * D.e + c] * vh[j * D.e + c];
        acc *= drop.factor(D, h, i, j);
        dp[size_t(j)] = acc;
        row += acc * pr[size_t(i * D.tk + j)];
      }
      for (int64_t j = 0; j < D.tk; ++j) {
        const double pij = pr[size_t(i * D.tk + j)], wij = pij * drop.factor(D, h, i, j);
        const double ds = pij * (dp[size_t(j)] - row);
        for (int64_t c = 0; c < D.e; ++c) {
          dq[i * D.e + c] += sc * ds * kh[j * D.e + c];
          dk[j * D.e + c] += sc * ds * qh[i * D.e + c];
          dv[j * D.e + c] += wij * gh[i * D.e + c];
        }
      }
    }
  }
  if (!flat) return placed_in_sliced(a.node, grads);
  RefValue r = ref_out(a.node);
  r.v = grads;
  return r;
}

namespace {

// x [B, T, H, D], tables [T, D] or [B, T, D]. Forward, i < h = D/2:
//   y[i] = x[i] c[i] - x[i+h] s[i],  y[i+h] = x[i+h] c[i+h] + x[i] s[i+h];
// the adjoint (back): dx[i] = dy[i] c[i] + dy[i+h] s[i+h], dx[i+h] = dy[i+h] c[i+h] - dy[i] s[i].
RefValue rope(const RefArgs& a, bool back) {
  const RefValue &x = a.in(0), &c = a.in(1), &s = a.in(2);
  RefValue r = ref_out(a.node, x.shape);
  const int64_t B = x.shape[0], T = x.shape[1], H = x.shape[2], D = x.shape[3], h = D / 2;
  const bool per_row = c.shape == Shape{B, T, D};  // per sequence (packed positions)
  if ((c.shape != Shape{T, D} && !per_row) || s.shape != c.shape)
    ref_fail(a.node, "tables are not [T, D] or [B, T, D]");
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t hh = 0; hh < H; ++hh) {
        const size_t base = size_t(((b * T + t) * H + hh) * D);
        const double* xr = x.v.data() + base;
        const int64_t row = per_row ? b * T + t : t;
        const double* cr = c.v.data() + row * D;
        const double* sr = s.v.data() + row * D;
        for (int64_t i = 0; i < h; ++i) {
          const double lo = xr[i], hi = xr[i + h];
          r.v[base + size_t(i)] = back ? lo * cr[i] + hi * sr[i + h] : lo * cr[i] - hi * sr[i];
          r.v[base + size_t(i + h)] =
              back ? hi * cr[i + h] - lo * sr[i] : hi * cr[i + h] + lo * sr[i + h];
        }
      }
  return r;
}

}  // namespace

RefValue ref_ROPE(const RefArgs& a) { return rope(a, false); }
RefValue ref_ROPE_BACK(const RefArgs& a) { return rope(a, true); }

}  // namespace kiln::test
