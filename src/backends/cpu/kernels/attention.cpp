// ATTENTION and ATTENTION_BACK: fused scaled dot-product attention, one head
// (one index of the leading dims) per task, heads split over threads, so the
// result does not depend on the thread count. Memory is O(T) per head: the head's
// keys and values are packed into thread scratch (k transposed, so the scores of
// kW keys are one vector FMA chain over E), and the [Tq, Tk] score matrix never
// exists.
//
// Forward (FlashAttention's online softmax): per query row, keys in blocks of
// kKeyBlock; the running max m, sum l and output accumulator are rescaled by
// exp(m_old - m_new) when a block raises the max.
// Backward: per query row the scores are recomputed, first for the row's
// logsumexp L, then p = exp(s - L); with dp = dO v^T and D = dO . O,
// ds = p (dp - D); dq = scale ds k, and dk += scale ds q, dv += p dO accumulate in
// scratch for the head.
#include <cmath>
#include <cstring>
#include <limits>

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr int64_t kKeyBlock = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One head of a [..., T, E] tensor: its base and row/column byte strides.
struct HeadMat {
  const char* base;
  int64_t rs, cs;
  // Row i as contiguous floats (the memory itself, or a copy in buf).
  const float* row(int64_t i, int64_t e, float* buf) const {
    return f32_row(base + i * rs, DType::f32, cs, e, buf);
  }
};

HeadMat head_of(const TensorNode* t, int64_t h) {
  const int nd = t->shape.ndim();
  int64_t off = 0;
  for (int d = nd - 3; d >= 0; --d) {
    off += (h % t->shape[d]) * t->stride[d];
    h /= t->shape[d];
  }
  return {static_cast<const char*>(t->data) + off, t->stride[nd - 2], t->stride[nd - 1]};
}

// Keys visible to query row i: all Tk, or j <= i + (Tk - Tq) when causal.
int64_t visible(int64_t i, int64_t tq, int64_t tk, bool causal) {
  if (!causal) return tk;
  return std::clamp<int64_t>(i + tk - tq + 1, 0, tk);
}

// m rows of src (row i at src.row(i)) into dst^T: dst[c * ld + i].
void pack_transposed(const HeadMat& src, int64_t m, int64_t e, float* dst, int64_t ld, float* buf) {
  for (int64_t i = 0; i < m; ++i) {
    const float* r = src.row(i, e, buf);
    for (int64_t c = 0; c < e; ++c) dst[c * ld + i] = r[c];
  }
}

// m rows of src into dst (row-major, ld e).
void pack_rows(const HeadMat& src, int64_t m, int64_t e, float* dst) {
  for (int64_t i = 0; i < m; ++i) {
    const float* r = src.row(i, e, dst + i * e);
    if (r != dst + i * e) std::memcpy(dst + i * e, r, size_t(e) * sizeof(float));
  }
}

// s[j] = scale * sum_c q[c] kt[c * ld + j] for j in [j0, j1); kt is E x ld.
void scores(const float* q, const float* kt, int64_t ld, int64_t e, int64_t j0, int64_t j1,
            float scale, float* s) {
  for (int64_t j = j0; j < j1; j += kW) {
    const int m = int(std::min(kW, j1 - j));
    VF a0 = vm::c<VF>(0.0f), a1 = a0, a2 = a0, a3 = a0;
    int64_t c = 0;
    for (; c + 4 <= e; c += 4) {  // four chains hide the FMA latency
      a0 = vm::madd(vm::c<VF>(q[c]), vm::loadv<VF>(kt + c * ld + j, m), a0);
      a1 = vm::madd(vm::c<VF>(q[c + 1]), vm::loadv<VF>(kt + (c + 1) * ld + j, m), a1);
      a2 = vm::madd(vm::c<VF>(q[c + 2]), vm::loadv<VF>(kt + (c + 2) * ld + j, m), a2);
      a3 = vm::madd(vm::c<VF>(q[c + 3]), vm::loadv<VF>(kt + (c + 3) * ld + j, m), a3);
    }
    for (; c < e; ++c) a0 = vm::madd(vm::c<VF>(q[c]), vm::loadv<VF>(kt + c * ld + j, m), a0);
    vm::store(s + j, ((a0 + a1) + (a2 + a3)) * vm::c<VF>(scale), m);
  }
}

// acc[0, e) += sum over j in [j0, j1) of w[j] * rows[j * e, (j + 1) * e): up to
// four vectors of acc at a time stay in registers over the whole j loop (two
// sets, even and odd j, for two FMA chains each), instead of a load and store
// of acc per row.
void weighted_rows(const float* w, const float* rows, int64_t j0, int64_t j1, int64_t e,
                   float* acc) {
  constexpr int kV = 4;
  for (int64_t c0 = 0; c0 < e; c0 += kV * kW) {
    int m[kV];
    int nv = 0;
    for (; nv < kV && c0 + nv * kW < e; ++nv) m[nv] = int(std::min(kW, e - c0 - nv * kW));
    VF a[kV], b[kV];
    for (int v = 0; v < kV; ++v) b[v] = a[v] = vm::c<VF>(0.0f);
    int64_t j = j0;
    for (; j + 2 <= j1; j += 2) {
      const VF w0 = vm::c<VF>(w[j]), w1 = vm::c<VF>(w[j + 1]);
      const float* r0 = rows + j * e + c0;
      const float* r1 = r0 + e;
      for (int v = 0; v < nv; ++v) {
        a[v] = vm::madd(w0, vm::loadv<VF>(r0 + v * kW, m[v]), a[v]);
        b[v] = vm::madd(w1, vm::loadv<VF>(r1 + v * kW, m[v]), b[v]);
      }
    }
    if (j < j1) {
      const VF w0 = vm::c<VF>(w[j]);
      const float* r0 = rows + j * e + c0;
      for (int v = 0; v < nv; ++v) a[v] = vm::madd(w0, vm::loadv<VF>(r0 + v * kW, m[v]), a[v]);
    }
    for (int v = 0; v < nv; ++v) {
      float* o = acc + c0 + v * kW;
      vm::store(o, vm::loadv<VF>(o, m[v]) + (a[v] + b[v]), m[v]);
    }
  }
}

// y[0, e) += a * x[0, e)
inline void axpy(float a, const float* x, float* y, int64_t e) {
  const VF va = vm::c<VF>(a);
  for (int64_t c = 0; c < e; c += kW) {
    const int m = int(std::min(kW, e - c));
    vm::store(y + c, vm::madd(va, vm::loadv<VF>(x + c, m), vm::loadv<VF>(y + c, m)), m);
  }
}

inline float dot(const float* a, const float* b, int64_t e) {
  VF acc = vm::c<VF>(0.0f);
  for (int64_t c = 0; c < e; c += kW) {
    const int m = int(std::min(kW, e - c));
    acc = vm::madd(vm::loadv<VF>(a + c, m), vm::loadv<VF>(b + c, m), acc);
  }
  return vm::hsum(acc);
}

struct Dims {
  int64_t heads, tq, tk, e;
};
Dims dims_of(const TensorNode* q, const TensorNode* k) {
  const int nd = q->shape.ndim();
  return {q->numel() / std::max<int64_t>(1, q->shape[nd - 2] * q->shape[nd - 1]), q->shape[nd - 2],
          k->shape[nd - 2], q->shape[nd - 1]};
}

}  // namespace

void kernel_ATTENTION(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const AttentionParams p = op_params<Op::ATTENTION>(*dst);
  const Dims D = dims_of(q, k);
  if (dst->numel() == 0) return;
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, D.tq * D.tk * D.e), 1);
  if (hr.empty()) return;
  const int64_t ld = round_up(std::max<int64_t>(D.tk, 1), kW), e = D.e;
  const int64_t eb = round_up(e, kW);
  float* kt =
      static_cast<float*>(t.scratch(size_t(e * ld + D.tk * e + ld + 3 * eb) * sizeof(float)));
  float* vp = kt + e * ld;
  float* s = vp + D.tk * e;
  float* qbuf = s + ld;
  float* acc = qbuf + eb;
  float* rbuf = acc + eb;
  float* out = static_cast<float*>(dst->data);
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    const HeadMat qh = head_of(q, h), kh = head_of(k, h), vh = head_of(v, h);
    pack_transposed(kh, D.tk, e, kt, ld, rbuf);
    pack_rows(vh, D.tk, e, vp);
    for (int64_t i = 0; i < D.tq; ++i) {
      const float* qi = qh.row(i, e, qbuf);
      const int64_t n = visible(i, D.tq, D.tk, p.causal);
      float* o = out + (h * D.tq + i) * e;
      std::fill(acc, acc + e, 0.0f);
      float m = kNegInf, l = 0.0f;
      for (int64_t j0 = 0; j0 < n; j0 += kKeyBlock) {
        const int64_t j1 = std::min(n, j0 + kKeyBlock);
        scores(qi, kt, ld, e, j0, j1, p.scale, s);
        float bm = m;
        for (int64_t j = j0; j < j1; ++j) bm = s[j] > bm ? s[j] : bm;
        if (bm == kNegInf) continue;         // (only with -inf inputs)
        const float corr = vm::exp(m - bm);  // 0 on the first block
        l *= corr;
        if (m != kNegInf && corr != 1.0f)
          for (int64_t c = 0; c < e; ++c) acc[c] *= corr;
        m = bm;
        // exp in vectors, then the value rows weighted by them
        const VF vbm = vm::c<VF>(bm);
        VF ls = vm::c<VF>(0.0f);
        for (int64_t j = j0; j < j1; j += kW) {
          const int mm = int(std::min(kW, j1 - j));
          const VF pe = vm::exp(vm::loadv<VF>(s + j, mm) - vbm);
          vm::store(s + j, pe, mm);
          ls = ls + vm::loadv<VF>(s + j, mm);  // masked lanes read 0
        }
        l += vm::hsum(ls);
        weighted_rows(s, vp, j0, j1, e, acc);
      }
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;  // no visible key: zeros
      for (int64_t c = 0; c < e; ++c) o[c] = acc[c] * inv;
    }
  }
}

void kernel_ATTENTION_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const TensorNode *o = dst->src[3], *dout = dst->src[4];
  const AttentionParams p = op_params<Op::ATTENTION_BACK>(*dst);
  const Dims D = dims_of(q, k);
  const int64_t nq = q->numel(), nk = k->numel();
  float* out = static_cast<float*>(dst->data);
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, 3 * D.tq * D.tk * D.e), 1);
  if (hr.empty()) return;
  const int64_t ld = round_up(std::max<int64_t>(D.tk, 1), kW), e = D.e;
  const int64_t eb = round_up(e, kW);
  float* kt = static_cast<float*>(
      t.scratch(size_t(2 * e * ld + D.tk * e + 2 * ld + 4 * eb) * sizeof(float)));
  float* vt = kt + e * ld;
  float* kp = vt + e * ld;
  float* s = kp + D.tk * e;
  float* dp = s + ld;
  float* qbuf = dp + ld;
  float* obuf = qbuf + eb;
  float* gbuf = obuf + eb;
  float* rbuf = gbuf + eb;
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    const HeadMat qh = head_of(q, h), kh = head_of(k, h), vh = head_of(v, h);
    const HeadMat oh = head_of(o, h), gh = head_of(dout, h);
    pack_transposed(kh, D.tk, e, kt, ld, rbuf);
    pack_transposed(vh, D.tk, e, vt, ld, rbuf);
    pack_rows(kh, D.tk, e, kp);
    float* dq = out + h * D.tq * e;
    float* dk = out + nq + h * D.tk * e;  // accumulated in place: the head's own rows
    float* dv = out + nq + nk + h * D.tk * e;
    std::fill(dk, dk + D.tk * e, 0.0f);
    std::fill(dv, dv + D.tk * e, 0.0f);
    for (int64_t i = 0; i < D.tq; ++i) {
      float* dqi = dq + i * e;
      std::fill(dqi, dqi + e, 0.0f);
      const int64_t n = visible(i, D.tq, D.tk, p.causal);
      if (n == 0) continue;
      const float* qi = qh.row(i, e, qbuf);
      const float* gi = gh.row(i, e, gbuf);
      const float dsum = dot(gi, oh.row(i, e, obuf), e);
      scores(qi, kt, ld, e, 0, n, p.scale, s);
      float m = kNegInf;
      for (int64_t j = 0; j < n; ++j) m = s[j] > m ? s[j] : m;
      if (m == kNegInf) continue;
      float l = 0.0f;
      const VF vm_ = vm::c<VF>(m);
      {
        VF acc = vm::c<VF>(0.0f);
        for (int64_t j = 0; j < n; j += kW) {
          const int mm = int(std::min(kW, n - j));
          const VF pe = vm::exp(vm::loadv<VF>(s + j, mm) - vm_);
          vm::store(s + j, pe, mm);
          acc = acc + vm::loadv<VF>(s + j, mm);
        }
        l = vm::hsum(acc);
      }
      // p = exp(s - m) / l; dp[j] = dO . v_j (scale 1)
      scores(gi, vt, ld, e, 0, n, 1.0f, dp);
      const VF inv = vm::c<VF>(1.0f / l), vd = vm::c<VF>(dsum), vs = vm::c<VF>(p.scale);
      for (int64_t j = 0; j < n; j += kW) {
        const int mm = int(std::min(kW, n - j));
        const VF pj = vm::loadv<VF>(s + j, mm) * inv;
        vm::store(s + j, pj, mm);                                           // p
        vm::store(dp + j, pj * (vm::loadv<VF>(dp + j, mm) - vd) * vs, mm);  // scale * ds
      }
      weighted_rows(dp, kp, 0, n, e, dqi);
      for (int64_t j = 0; j < n; ++j) {
        axpy(dp[j], qi, dk + j * e, e);
        axpy(s[j], gi, dv + j * e, e);
      }
    }
  }
}

}  // namespace kiln::cpu
