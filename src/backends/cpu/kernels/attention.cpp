// ATTENTION_BACK: the backward of the fused scaled dot-product attention (the
// forward is attention_forward.cpp). Whole heads are split over threads, so the
// result does not depend on the thread count. Memory is O(T) per head: the
// head's keys and values are packed into thread scratch (k transposed, so the
// scores of a key block are vector FMA chains over E), and the [Tq, Tk] score
// matrix never exists. Queries go in tiles of kR rows, so that every product is
// a register-blocked micro-kernel (kR rows x kNV vectors of accumulators) that
// loads each key or value row once per tile instead of once per query.
//
// Per query tile, keys in one pass: the scores S = scale q k^T and
// dp = dO v^T are recomputed for the tile's rows (kR x Tk), then p = softmax(S)
// and D = dO . O give ds = p (dp - D); dq = scale ds k, and dk += scale ds^T q,
// dv += p^T dO accumulate in the head's rows of the output. Keys no row of a
// tile sees are skipped: past the causal limit, and before the first key of
// the tile's packed examples (segment ids). Dropout (AttentionParams::keep <
// 1): each row's mask factors f are recomputed from the seed (DropMask); dv
// takes p f and ds = p (dp f - D).
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/attention_bf16.h"
#include "backends/cpu/kernels/attention_head.h"
#include "backends/cpu/kernels/attention_small.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/row_ops.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using namespace attn;
using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Floats between the rows of a packed k^T or v^T for tk keys. The tile kernels
// read E rows of it at a time (one vector chunk of each); rows a multiple of
// 512 bytes apart would fall into a few L1 sets and evict each other (T = 512:
// 2 KiB apart, every load an L2 hit), so such strides get one vector more.
int64_t packed_ld(int64_t tk) {
  const int64_t ld = round_up(std::max<int64_t>(tk, 1), kW);
  return ld % 128 == 0 ? ld + kW : ld;
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

// Register-blocked tile products. A tile is up to kR query rows; the kernels
// are templates over its row count so that every accumulator is a register.
constexpr int kR = 4;
constexpr int kNV = kW >= 16 ? 4 : 2;  // vectors per row: 16 accumulators (AVX-512), else 8

// Calls f.template operator()<NV>() with NV = nvec, a vector count in [1, kNV].
static_assert(kNV <= 4);
template <class F>
void with_vectors(int64_t nvec, F&& f) {
  switch (nvec) {
    case 1: f.template operator()<1>(); break;
    case 2:
      if constexpr (kNV >= 2) f.template operator()<2>();
      break;
    case 3:
      if constexpr (kNV >= 3) f.template operator()<3>();
      break;
    default:
      if constexpr (kNV >= 4) f.template operator()<4>();
      break;
  }
}

// S[r * lds + (j - j0)] = scale * sum_c a[r * e + c] bt[c * ld + j] for r < R,
// j in [j0, j1): R rows of a (row-major) times columns of bt (E x ld). One call
// covers NV vectors of columns from j, the last one m lanes wide.
// (The pragmas unroll the register tile's loops before GCC's scalar
// replacement; otherwise acc lives on the stack, a load and a store per FMA.)
template <int R, int NV>
void tile_scores_at(const float* a, const float* bt, int64_t ld, int64_t e, int64_t j, int m,
                    float scale, float* S, int64_t lds) {
  VF acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) acc[r][v] = vm::c<VF>(0.0f);
  for (int64_t c = 0; c < e; ++c) {
    VF b[NV];
    const float* bc = bt + c * ld + j;
#pragma GCC unroll 16
    for (int v = 0; v + 1 < NV; ++v) b[v] = vm::loadv<VF>(bc + v * kW);
    b[NV - 1] = vm::loadv<VF>(bc + (NV - 1) * kW, m);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const VF ar = vm::c<VF>(a[r * e + c]);
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) acc[r][v] = vm::madd(ar, b[v], acc[r][v]);
    }
  }
  const VF vs = vm::c<VF>(scale);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 16
    for (int v = 0; v + 1 < NV; ++v) vm::store(S + r * lds + v * kW, acc[r][v] * vs);
    vm::store(S + r * lds + (NV - 1) * kW, acc[r][NV - 1] * vs, m);
  }
}

template <int R>
void tile_scores(const float* a, const float* bt, int64_t ld, int64_t e, int64_t j0, int64_t j1,
                 float scale, float* S, int64_t lds) {
  int64_t j = j0;
  for (; j + kNV * kW <= j1; j += kNV * kW)
    tile_scores_at<R, kNV>(a, bt, ld, e, j, kW, scale, S + (j - j0), lds);
  if (j == j1) return;
  const int64_t rest = j1 - j, nvec = (rest + kW - 1) / kW;  // <= kNV
  const int m = int(rest - (nvec - 1) * kW);
  with_vectors(
      nvec, [&]<int NV>() { tile_scores_at<R, NV>(a, bt, ld, e, j, m, scale, S + (j - j0), lds); });
}

// Runs f.template operator()<NV>(c0, m) over the columns [0, e) in chunks of
// up to kNV vectors (NV a compile-time count, the chunk's last vector m lanes
// wide), so the kernels below keep their accumulators in registers.
template <class F>
void over_column_chunks(int64_t e, F&& f) {
  int64_t c0 = 0;
  for (; c0 + kNV * kW <= e; c0 += kNV * kW) f.template operator()<kNV>(c0, int(kW));
  if (c0 == e) return;
  const int64_t rest = e - c0, nvec = (rest + kW - 1) / kW;  // <= kNV
  const int m = int(rest - (nvec - 1) * kW);
  with_vectors(nvec, [&]<int NV>() { f.template operator()<NV>(c0, m); });
}

// Loads NV vectors from p, the last one m lanes wide (the rest read 0).
template <int NV>
void load_chunk(const float* p, int m, VF* out) {
  for (int v = 0; v + 1 < NV; ++v) out[v] = vm::loadv<VF>(p + v * kW);
  out[NV - 1] = vm::loadv<VF>(p + (NV - 1) * kW, m);
}
template <int NV>
void store_chunk(float* p, int m, const VF* in) {
  for (int v = 0; v + 1 < NV; ++v) vm::store(p + v * kW, in[v]);
  vm::store(p + (NV - 1) * kW, in[NV - 1], m);
}

// acc[r * lda + c] += sum over j in [j0, j1) of W[r * ldw + (j - j0)] rows[j * e + c]
// for r < R: R x NV accumulators stay in registers over the whole j loop, and
// each row of `rows` is loaded once for R.
template <int R>
void tile_weighted(const float* W, int64_t ldw, const float* rows, int64_t j0, int64_t j1,
                   int64_t e, float* acc, int64_t lda) {
  over_column_chunks(e, [&]<int NV>(int64_t c0, int m) {
    VF a[R][NV];
    for (int r = 0; r < R; ++r)
      for (int v = 0; v < NV; ++v) a[r][v] = vm::c<VF>(0.0f);
    for (int64_t j = j0; j < j1; ++j) {
      VF b[NV];
      load_chunk<NV>(rows + j * e + c0, m, b);
      for (int r = 0; r < R; ++r) {
        const VF w = vm::c<VF>(W[r * ldw + (j - j0)]);
        for (int v = 0; v < NV; ++v) a[r][v] = vm::madd(w, b[v], a[r][v]);
      }
    }
    for (int r = 0; r < R; ++r) {
      VF o[NV];
      load_chunk<NV>(acc + r * lda + c0, m, o);
      for (int v = 0; v < NV; ++v) o[v] = o[v] + a[r][v];
      store_chunk<NV>(acc + r * lda + c0, m, o);
    }
  });
}

// dst[j * ldd + c] += sum over r < R of W[r * ldw + j] a[r * e + c] for j in
// [0, n): the R rows of a stay in registers while each dst row is loaded and
// stored once for R.
template <int R>
void tile_outer_acc(const float* W, int64_t ldw, const float* a, int64_t n, int64_t e, float* dst,
                    int64_t ldd) {
  over_column_chunks(e, [&]<int NV>(int64_t c0, int m) {
    VF ar[R][NV];
    for (int r = 0; r < R; ++r) load_chunk<NV>(a + r * e + c0, m, ar[r]);
    for (int64_t j = 0; j < n; ++j) {
      VF x[NV];
      load_chunk<NV>(dst + j * ldd + c0, m, x);
      for (int r = 0; r < R; ++r) {
        const VF w = vm::c<VF>(W[r * ldw + j]);
        for (int v = 0; v < NV; ++v) x[v] = vm::madd(w, ar[r][v], x[v]);
      }
      store_chunk<NV>(dst + j * ldd + c0, m, x);
    }
  });
}

// Calls f.template operator()<R>() with R = nr in [1, kR] (the tile's row count
// as a compile-time constant).
template <class F>
void with_rows(int nr, F&& f) {
  switch (nr) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    default: f.template operator()<4>(); break;
  }
}

// nr rows of src starting at i0 into dst (row-major, ld e).
void pack_tile(const HeadMat& src, int64_t i0, int nr, int64_t e, float* dst) {
  for (int r = 0; r < nr; ++r) {
    const float* row = src.row(i0 + r, e, dst + r * e);
    if (row != dst + r * e) std::memcpy(dst + r * e, row, size_t(e) * sizeof(float));
  }
}

}  // namespace

void kernel_ATTENTION_BACK(TensorNode* dst, ThreadCtx& t) {
  if (attention_small_backward(dst, t)) return;  // small heads: whole heads per thread
  if (attention_bf16_backward(dst, t)) return;   // bf16 inputs on vdpbf16ps
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const TensorNode *o = dst->src[3], *dout = dst->src[4];
  const AttentionParams p = op_params<Op::ATTENTION_BACK>(*dst);
  const Dims D = dims_of(q, k);
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, 3 * D.tq * D.tk * D.e), 1);
  if (hr.empty()) return;
  const int64_t ld = packed_ld(D.tk), e = D.e;
  const int64_t eb = round_up(e, kW);
  float* kt = static_cast<float*>(t.scratch(
      size_t(2 * e * ld + D.tk * e + 2 * kR * ld + ld + 2 * kR * eb + 2 * eb) * sizeof(float)));
  float* vt = kt + e * ld;
  float* kp = vt + e * ld;
  float* P = kp + D.tk * e;    // kR x ld: scores, then probabilities
  float* dS = P + kR * ld;     // kR x ld: dO v^T, then scale * ds
  float* mrow = dS + kR * ld;  // ld: a row's dropout factors
  float* qt = mrow + ld;
  float* gt = qt + kR * eb;
  float* obuf = gt + kR * eb;
  float* rbuf = obuf + eb;
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    const HeadMat qh = head_of(q, h), kh = head_of(k, h), vh = head_of(v, h);
    const HeadMat oh = head_of(o, h), gh = head_of(dout, h);
    pack_transposed(kh, D.tk, e, kt, ld, rbuf);
    pack_transposed(vh, D.tk, e, vt, ld, rbuf);
    pack_rows(kh, D.tk, e, kp);
    // dk and dv accumulate in place: the head's own rows.
    const GradRows dq = grad_head(dst, 0, h), dk = grad_head(dst, 1, h), dv = grad_head(dst, 2, h);
    for (int64_t j = 0; j < D.tk; ++j) {
      std::fill(dk.row(j), dk.row(j) + e, 0.0f);
      std::fill(dv.row(j), dv.row(j) + e, 0.0f);
    }
    for (int64_t i0 = 0; i0 < D.tq; i0 += kR) {
      const int nr = int(std::min<int64_t>(kR, D.tq - i0));
      float* dqi = dq.row(i0);  // the tile's rows of dq
      for (int r = 0; r < nr; ++r) std::fill(dqi + r * dq.ld, dqi + r * dq.ld + e, 0.0f);
      // Row r sees keys [kr[r].lo, kr[r].hi); the tile's columns are the keys
      // [j0, n_max) (j0 > 0 past earlier packed examples), P and dS hold key j
      // at column j - j0.
      KeyRange kr[kR];
      int64_t n_max = 0, lo_min = D.tk;
      for (int r = 0; r < nr; ++r) {
        kr[r] = ranges.row(h, i0 + r);
        n_max = std::max(n_max, kr[r].hi);
        lo_min = std::min(lo_min, kr[r].lo);
      }
      if (n_max == 0) continue;
      const int64_t j0 = lo_min < n_max ? lo_min / kW * kW : 0, nc = n_max - j0;
      pack_tile(qh, i0, nr, e, qt);
      pack_tile(gh, i0, nr, e, gt);
      with_rows(nr, [&]<int R>() {
        tile_scores<R>(qt, kt, ld, e, j0, n_max, p.scale, P, ld);
        tile_scores<R>(gt, vt, ld, e, j0, n_max, 1.0f, dS, ld);  // dp[j] = dO . v_j
      });
      // Per row: p = softmax over its visible keys (0 outside them, and for a
      // row with none); ds = p (dp - dO . O), times scale for dq and dk.
      for (int r = 0; r < nr; ++r) {
        float* pr = P + r * ld;
        float* dr = dS + r * ld;
        const int64_t a = std::clamp(kr[r].lo - j0, int64_t(0), nc);
        const int64_t n = std::max(a, kr[r].hi - j0);
        const float m = row_max(pr + a, n - a);
        if (m == kNegInf) {
          std::fill(pr, pr + nc, 0.0f);
          std::fill(dr, dr + nc, 0.0f);
          continue;
        }
        const float l = exp_store_sum(pr + a, n - a, m);
        const float dsum = dot(gt + r * e, oh.row(i0 + r, e, obuf), e);
        const VF inv = vm::c<VF>(1.0f / l), vd = vm::c<VF>(dsum);
        const VF vs = vm::c<VF>(p.scale);
        if (drop.on()) {
          // With dropout factors f: O = (p f) V, so dv takes p f, and dp f
          // replaces dp in ds = p (dp f - D) (D = dO . O still).
          drop.factors(h, i0 + r, j0 + a, n - a, mrow + a);
          for (int64_t j = a; j < n; j += kW) {
            const int mm = int(std::min(kW, n - j));
            const VF pj = vm::loadv<VF>(pr + j, mm) * inv, fj = vm::loadv<VF>(mrow + j, mm);
            vm::store(pr + j, pj * fj, mm);                                          // p f
            vm::store(dr + j, pj * (vm::loadv<VF>(dr + j, mm) * fj - vd) * vs, mm);  // scale * ds
          }
        } else {
          for (int64_t j = a; j < n; j += kW) {
            const int mm = int(std::min(kW, n - j));
            const VF pj = vm::loadv<VF>(pr + j, mm) * inv;
            vm::store(pr + j, pj, mm);                                          // p
            vm::store(dr + j, pj * (vm::loadv<VF>(dr + j, mm) - vd) * vs, mm);  // scale * ds
          }
        }
        std::fill(pr, pr + a, 0.0f);
        std::fill(dr, dr + a, 0.0f);
        std::fill(pr + n, pr + nc, 0.0f);
        std::fill(dr + n, dr + nc, 0.0f);
      }
      with_rows(nr, [&]<int R>() {
        tile_weighted<R>(dS, ld, kp, j0, n_max, e, dqi, dq.ld);   // dq = scale ds k
        tile_outer_acc<R>(dS, ld, qt, nc, e, dk.row(j0), dk.ld);  // dk += scale ds^T q
        tile_outer_acc<R>(P, ld, gt, nc, e, dv.row(j0), dv.ld);   // dv += p^T dO
      });
    }
  }
}

}  // namespace kiln::cpu
