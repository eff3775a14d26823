// ATTENTION and ATTENTION_BACK with bf16 q, k, v on vdpbf16ps (AVX512_BF16).
// The structure is attention.cpp's (query tiles of kR rows, keys of a head
// packed once per head, online softmax over key blocks forward, one pass over
// the keys per tile backward); what changes is that every product takes bf16
// pairs: one vdpbf16ps multiplies two bf16 pairs per lane exactly and adds both
// to an f32 accumulator, twice the multiply-adds of an f32 FMA.
//
// Packed layouts (32-bit words of two bf16, the first in the low half):
//   k2  [E/2][ldk]   key j's elements (2c, 2c+1) at k2[c * ldk + j]: scores
//                    q k^T (and dO v^T backward) pair over E
//   v2  [Tk/2][eb]   keys (2j, 2j+1) of element c at v2[j * eb + c]: PV (and
//                    dS K backward) pair over keys
// Odd E or Tk pair their last element with 0; rows are padded with zeros to
// whole vectors, so no load is masked. The softmax weights P and dS are rounded
// to bf16 for the products that read them (as FlashAttention does); the row
// max, sum, D = dO . O and every accumulator are f32. Results do not depend on
// the thread count (each tile, or head backward, is computed the same way by
// whichever thread owns it). Segment ids (packed examples) mask the keys of
// earlier examples; unlike the f32 kernels, these paths do not skip them.
// Dropout (AttentionParams::keep < 1) as the f32 kernels: mask factors
// (DropMask) on the weights after the row sums; recomputed backward.
#include "backends/cpu/kernels/attention_bf16.h"
#include "backends/cpu/kernels/attention_head.h"

#include "backends/cpu/kernels/common.h"

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define KILN_ATTENTION_BF16 1
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/row_ops.h"
#endif

namespace kiln::cpu {

#if !defined(KILN_ATTENTION_BF16)

bool attention_bf16_forward(TensorNode*, ThreadCtx&) { return false; }
bool attention_bf16_backward(TensorNode*, ThreadCtx&) { return false; }

#else

namespace {

constexpr int64_t kV = 16;  // f32 lanes of a zmm
constexpr int kR = 4;       // query rows per tile
constexpr int kMaxNV = 4;   // zmm of keys (or of E) per register tile
constexpr int64_t kKeyBlock = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

using attn::Dims;
using attn::dims_of;
using attn::DropMask;
using attn::grad_head;
using attn::GradRows;
using attn::KeyRange;
using attn::KeyRanges;
using attn::round_up;
using attn::visible;

// Words between the rows of k2 (as attention.cpp's packed_ld: rows a multiple
// of 512 bytes apart would share a few L1 sets).
int64_t packed_ld(int64_t tk) {
  const int64_t ld = round_up(std::max<int64_t>(tk, 1), kV);
  return ld % 128 == 0 ? ld + kV : ld;
}

// One head of a bf16 [..., T, E] tensor: row i's element c at base + i*rs + c*cs.
struct Head {
  const char* base;
  int64_t rs, cs;
  // Row i as contiguous bf16: the memory itself, or gathered into buf.
  const uint16_t* row(int64_t i, int64_t e, uint16_t* buf) const {
    const char* p = base + i * rs;
    if (cs == 2) return reinterpret_cast<const uint16_t*>(p);
    for (int64_t c = 0; c < e; ++c) std::memcpy(buf + c, p + c * cs, 2);
    return buf;
  }
};

// Head h of t (attention_head.h's view, read as bf16 here).
Head head_of(const TensorNode* t, int64_t h) {
  const attn::HeadMat m = attn::head_of(t, h);
  return {m.base, m.rs, m.cs};
}

// dst[c] = a[c] | b[c] << 16 for c < n (b null: zeros), then zeros up to n_pad.
void interleave(const uint16_t* a, const uint16_t* b, int64_t n, int64_t n_pad, uint32_t* dst) {
  int64_t c = 0;
  for (; c < n; c += kV) {
    const __mmask16 m = c + kV <= n ? __mmask16(0xffff) : __mmask16((1u << (n - c)) - 1);
    const __m512i lo = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, a + c));
    const __m512i hi =
        b ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, b + c)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
  for (c = n; c < n_pad; ++c) dst[c] = 0;
}

// The same for f32 rows, rounded to bf16 (nearest even) on the way.
void interleave_f32(const float* a, const float* b, int64_t n, int64_t n_pad, uint32_t* dst) {
  int64_t c = 0;
  for (; c < n; c += kV) {
    const __mmask16 m = c + kV <= n ? __mmask16(0xffff) : __mmask16((1u << (n - c)) - 1);
    const __m512i lo =
        _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, a + c)));
    const __m512i hi =
        _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, b + c)));
    _mm512_mask_storeu_epi32(dst + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
  for (c = n; c < n_pad; ++c) dst[c] = 0;
}

// k2 layout (pairs over E) of tk rows of x: dst[c * ld + j], zero-padded to ld.
// A row's adjacent pairs already are the 32-bit words: a transpose of words.
void pack_pairs_over_e(const Head& x, int64_t tk, int64_t e, uint32_t* dst, int64_t ld,
                       uint16_t* buf) {
  const int64_t ep = (e + 1) / 2, ew = e / 2;
  for (int64_t j = 0; j < tk; ++j) {
    const uint16_t* r = x.row(j, e, buf);
    for (int64_t c = 0; c < ew; ++c) {
      uint32_t w;
      std::memcpy(&w, r + 2 * c, 4);
      dst[c * ld + j] = w;
    }
    if (ew < ep) dst[ew * ld + j] = r[e - 1];
  }
  for (int64_t c = 0; c < ep; ++c) std::fill(dst + c * ld + tk, dst + (c + 1) * ld, 0u);
}

// v2 layout (pairs over rows) of tk rows of x: dst[j * eb + c], zero-padded.
void pack_pairs_over_rows(const Head& x, int64_t tk, int64_t e, int64_t eb, uint32_t* dst,
                          uint16_t* buf) {
  for (int64_t j = 0; 2 * j < tk; ++j) {
    const uint16_t* a = x.row(2 * j, e, buf);
    const uint16_t* b = 2 * j + 1 < tk ? x.row(2 * j + 1, e, buf + e) : nullptr;
    interleave(a, b, e, eb, dst + j * eb);
  }
}

// nr rows of x from i0, pairs over E: dst[r * ep + c] (rows nr..kR zero).
void pack_rows_pairs(const Head& x, int64_t i0, int nr, int64_t e, uint32_t* dst, uint16_t* buf) {
  const int64_t ep = (e + 1) / 2;
  std::memset(dst, 0, size_t(kR * ep) * 4);
  for (int r = 0; r < nr; ++r) std::memcpy(dst + r * ep, x.row(i0 + r, e, buf), size_t(e) * 2);
}

// nr rows of x from i0, interleaved over row pairs: dst[p * eb + c] holds rows
// (2p, 2p+1) of element c (the missing rows of a short tile are 0).
void pack_rows_interleaved(const Head& x, int64_t i0, int nr, int64_t e, int64_t eb, uint32_t* dst,
                           uint16_t* buf) {
  for (int p = 0; p < kR / 2; ++p) {
    if (2 * p >= nr) {
      std::fill(dst + p * eb, dst + (p + 1) * eb, 0u);
      continue;
    }
    const uint16_t* a = x.row(i0 + 2 * p, e, buf);
    const uint16_t* b = 2 * p + 1 < nr ? x.row(i0 + 2 * p + 1, e, buf + e) : nullptr;
    interleave(a, b, e, eb, dst + p * eb);
  }
}

inline __m512bh bh(__m512i x) { return (__m512bh)x; }
inline __m512i load_words(const uint32_t* p) { return _mm512_loadu_si512(p); }

// Calls f.template operator()<N>() with N = n in [1, kMaxNV].
template <class F>
void with_n(int64_t n, F&& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    default: f.template operator()<4>(); break;
  }
}
template <class F>
void with_rows(int nr, F&& f) {
  with_n(nr, std::forward<F>(f));
}

// S[r * lds + (j - j0) + v*16] = scale * sum_c a[r][c] . b2[c][j + v*16] for the
// keys [j0, j1) (whole vectors: the last may run past j1 into the padding).
template <int R>
void scores(const uint32_t* a2, int64_t ep, const uint32_t* b2, int64_t ld, int64_t j0, int64_t j1,
            float scale, float* S, int64_t lds) {
  const __m512 vs = _mm512_set1_ps(scale);
  for (int64_t j = j0; j < j1; j += kMaxNV * kV) {
    const int64_t nv = std::min<int64_t>(kMaxNV, (j1 - j + kV - 1) / kV);
    with_n(nv, [&]<int NV>() {
      __m512 acc[R][NV];
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_setzero_ps();
      for (int64_t c = 0; c < ep; ++c) {
        __m512i b[NV];
        for (int v = 0; v < NV; ++v) b[v] = load_words(b2 + c * ld + j + v * kV);
        for (int r = 0; r < R; ++r) {
          const __m512i a = _mm512_set1_epi32(int(a2[r * ep + c]));
          for (int v = 0; v < NV; ++v) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], bh(a), bh(b[v]));
        }
      }
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v)
          _mm512_storeu_ps(S + r * lds + (j - j0) + v * kV, _mm512_mul_ps(acc[r][v], vs));
    });
  }
}

// acc[r * eb + c] += sum over key pairs p < np of w[r][p] . v2[p][c]: R rows of
// pair weights (ldw words apart) times the pair-packed rows of v2 (eb words).
template <int R>
void weighted(const uint32_t* w2, int64_t ldw, const uint32_t* v2, int64_t np, int64_t eb,
              float* acc) {
  for (int64_t c0 = 0; c0 < eb; c0 += kMaxNV * kV) {
    with_n(std::min<int64_t>(kMaxNV, (eb - c0) / kV), [&]<int NV>() {
      __m512 o[R][NV];
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) o[r][v] = _mm512_setzero_ps();
      for (int64_t p = 0; p < np; ++p) {
        __m512i b[NV];
        for (int v = 0; v < NV; ++v) b[v] = load_words(v2 + p * eb + c0 + v * kV);
        for (int r = 0; r < R; ++r) {
          const __m512i a = _mm512_set1_epi32(int(w2[r * ldw + p]));
          for (int v = 0; v < NV; ++v) o[r][v] = _mm512_dpbf16_ps(o[r][v], bh(a), bh(b[v]));
        }
      }
      for (int r = 0; r < R; ++r)
        for (int v = 0; v < NV; ++v) {
          float* d = acc + r * eb + c0 + v * kV;
          _mm512_storeu_ps(d, _mm512_add_ps(_mm512_loadu_ps(d), o[r][v]));
        }
    });
  }
}

// dst[j * eb + c] += sum over row pairs p < RP of w[p][j] . x2[p][c] for j < n:
// the transposed products dS^T Q and P^T dO, rows of the tile paired (w2 holds
// key j's weights of rows (2p, 2p+1) at w2[p * ldw + j]).
template <int RP>
void outer_acc(const uint32_t* w2, int64_t ldw, const uint32_t* x2, int64_t n, int64_t eb,
               float* dst) {
  for (int64_t c0 = 0; c0 < eb; c0 += kMaxNV * kV) {
    with_n(std::min<int64_t>(kMaxNV, (eb - c0) / kV), [&]<int NV>() {
      __m512i x[RP][NV];
      for (int p = 0; p < RP; ++p)
        for (int v = 0; v < NV; ++v) x[p][v] = load_words(x2 + p * eb + c0 + v * kV);
      for (int64_t j = 0; j < n; ++j) {
        float* d = dst + j * eb + c0;
        __m512 o[NV];
        for (int v = 0; v < NV; ++v) o[v] = _mm512_loadu_ps(d + v * kV);
        for (int p = 0; p < RP; ++p) {
          const __m512i a = _mm512_set1_epi32(int(w2[p * ldw + j]));
          for (int v = 0; v < NV; ++v) o[v] = _mm512_dpbf16_ps(o[v], bh(a), bh(x[p][v]));
        }
        for (int v = 0; v < NV; ++v) _mm512_storeu_ps(d + v * kV, o[v]);
      }
    });
  }
}

// n f32 to bf16 (round to nearest even) at dst, then zeros up to n_pad.
void to_bf16(const float* src, int64_t n, int64_t n_pad, uint16_t* dst) {
  convert(reinterpret_cast<const char*>(src), DType::f32, 4, reinterpret_cast<char*>(dst),
          DType::bf16, 2, n);
  for (int64_t j = n; j < n_pad; ++j) dst[j] = 0;
}

bool all_bf16(const TensorNode* dst, int n) {
  for (int i = 0; i < n; ++i)
    if (dst->src[i]->dtype != DType::bf16) return false;
  return true;
}

// Units (head, tile) split into contiguous runs of about equal work (a tile
// costs the keys its last row sees).
Range tile_units(const ThreadCtx& t, const Dims& D, bool causal) {
  const int64_t tiles = (D.tq + kR - 1) / kR;
  auto cost = [&](int64_t i) {
    return visible(std::min(D.tq, (i + 1) * kR) - 1, D.tq, D.tk, causal) + kR;
  };
  int64_t per_head = 0;
  for (int64_t i = 0; i < tiles; ++i) per_head += cost(i);
  const int64_t total = D.heads * per_head;
  const int k = useful_threads(total, t.nth, kR * D.e);
  if (t.ith >= k) return {};
  const int64_t lo = total * t.ith / k, hi = total * (t.ith + 1) / k;
  Range r{D.heads * tiles, D.heads * tiles};
  int64_t start = 0;
  bool found = false;
  for (int64_t u = 0; u < D.heads * tiles; ++u) {
    if (!found && start >= lo) r.begin = u, found = true;
    if (start >= hi) {
      r.end = u;
      break;
    }
    start += cost(u % tiles);
  }
  if (!found) r.begin = r.end;
  return r;
}

}  // namespace

bool attention_bf16_forward(TensorNode* dst, ThreadCtx& t) {
  if (!all_bf16(dst, 3)) return false;
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const AttentionParams p = op_params<Op::ATTENTION>(*dst);
  const Dims D = dims_of(q, k);
  if (dst->numel() == 0) return true;
  const Range ur = tile_units(t, D, p.causal);
  if (ur.empty()) return true;
  const int64_t e = D.e, ep = (e + 1) / 2, eb = round_up(e, kV), ldk = packed_ld(D.tk);
  const int64_t tiles = (D.tq + kR - 1) / kR, np = (D.tk + 1) / 2;
  constexpr int64_t kPw = kKeyBlock / 2;  // pair words per row of P
  char* sp = static_cast<char*>(t.scratch(size_t(ep * ldk + np * eb + kR * ep + kR * kPw + e) * 4 +
                                          size_t(kR * kKeyBlock + kR * eb + eb) * sizeof(float)));
  uint32_t* k2 = reinterpret_cast<uint32_t*>(sp);
  uint32_t* v2 = k2 + ep * ldk;
  uint32_t* q2 = v2 + np * eb;
  uint32_t* p2 = q2 + kR * ep;
  uint16_t* rows = reinterpret_cast<uint16_t*>(p2 + kR * kPw);  // two gathered rows
  float* S = reinterpret_cast<float*>(p2 + kR * kPw + e);       // kR x kKeyBlock
  float* acc = S + kR * kKeyBlock;                              // kR x eb
  float* orow = acc + kR * eb;
  char* out = static_cast<char*>(dst->data);
  const int64_t osz = int64_t(dtype_size(dst->dtype));
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  Head qh{};
  for (int64_t u = ur.begin, packed = -1; u < ur.end; ++u) {
    const int64_t h = u / tiles, i0 = u % tiles * kR;
    if (h != packed) {
      qh = head_of(q, h);
      pack_pairs_over_e(head_of(k, h), D.tk, e, k2, ldk, rows);
      pack_pairs_over_rows(head_of(v, h), D.tk, e, eb, v2, rows);
      packed = h;
    }
    const int nr = int(std::min<int64_t>(kR, D.tq - i0));
    pack_rows_pairs(qh, i0, nr, e, q2, rows);
    float m[kR], l[kR];
    int64_t n_row[kR], lo_row[kR], n_max = 0;  // row r sees keys [lo_row, n_row)
    for (int r = 0; r < nr; ++r) {
      m[r] = kNegInf;
      l[r] = 0.0f;
      const KeyRange kr = ranges.row(h, i0 + r);
      n_row[r] = kr.hi;
      lo_row[r] = kr.lo;
      n_max = std::max(n_max, kr.hi);
    }
    std::fill(acc, acc + kR * eb, 0.0f);
    for (int64_t j0 = 0; j0 < n_max; j0 += kKeyBlock) {
      const int64_t j1 = std::min(n_max, j0 + kKeyBlock), nb = j1 - j0, npb = (nb + 1) / 2;
      with_rows(nr, [&]<int R>() { scores<R>(q2, ep, k2, ldk, j0, j1, p.scale, S, kKeyBlock); });
      for (int r = 0; r < nr; ++r) {
        float* sr = S + r * kKeyBlock;
        uint16_t* pr = reinterpret_cast<uint16_t*>(p2 + r * kPw);
        const int64_t n = std::clamp(n_row[r] - j0, int64_t(0), nb);  // visible in block
        const int64_t a = std::min(n, std::clamp(lo_row[r] - j0, int64_t(0), nb));  // from
        const float bm = std::max(m[r], row_max(sr + a, n - a));
        if (bm == kNegInf) {  // nothing visible yet: weight 0
          to_bf16(sr, 0, 2 * npb, pr);
          continue;
        }
        const float corr = std::exp(m[r] - bm);  // 0 on the first block
        l[r] *= corr;
        if (m[r] != kNegInf && corr != 1.0f)
          for (int64_t c = 0; c < e; ++c) acc[r * eb + c] *= corr;
        m[r] = bm;
        l[r] += exp_store_sum(sr + a, n - a, bm);
        if (drop.on() && n > a) drop.apply(h, i0 + r, j0 + a, n - a, sr + a);  // after the sum
        std::fill(sr, sr + a, 0.0f);  // keys of an earlier packed example weigh 0
        to_bf16(sr, n, 2 * npb, pr);  // keys past the row's causal limit weigh 0
      }
      with_rows(nr, [&]<int R>() { weighted<R>(p2, kPw, v2 + j0 / 2 * eb, npb, eb, acc); });
    }
    for (int r = 0; r < nr; ++r) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;  // no visible key: zeros
      for (int64_t c = 0; c < e; ++c) orow[c] = acc[r * eb + c] * inv;
      convert(reinterpret_cast<const char*>(orow), DType::f32, 4,
              out + (h * D.tq + i0 + r) * e * osz, dst->dtype, osz, e);
    }
  }
  return true;
}

bool attention_bf16_backward(TensorNode* dst, ThreadCtx& t) {
  // dO must be bf16 too (under the bf16 policy it is: the gradient of a bf16
  // output); an f32 dO keeps the f32 kernel rather than being rounded here.
  if (!all_bf16(dst, 3) || dst->src[4]->dtype != DType::bf16) return false;
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const TensorNode *o = dst->src[3], *dout = dst->src[4];
  const AttentionParams p = op_params<Op::ATTENTION_BACK>(*dst);
  const Dims D = dims_of(q, k);
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, 3 * D.tq * D.tk * D.e), 1);
  if (hr.empty()) return true;
  const int64_t e = D.e, ep = (e + 1) / 2, eb = round_up(e, kV), ldk = packed_ld(D.tk);
  const int64_t np = (D.tk + 1) / 2, ldp = round_up(ldk, 2 * kV);  // P / dS rows (floats)
  constexpr int kRP = kR / 2;
  char* sp = static_cast<char*>(
      t.scratch(size_t(2 * ep * ldk + np * eb + 2 * kR * ep + 2 * kRP * eb + 2 * ldk * kRP +
                       kR * ldp / 2 + e) *
                    4 +
                size_t(2 * kR * ldp + 2 * D.tk * eb + kR * eb + 2 * eb) * sizeof(float)));
  uint32_t* k2 = reinterpret_cast<uint32_t*>(sp);                    // pairs over E: scores
  uint32_t* v2 = k2 + ep * ldk;                                      // v pairs over E: dO v^T
  uint32_t* kp = v2 + ep * ldk;                                      // k pairs over keys: dS K
  uint32_t* q2 = kp + np * eb;                                       // the tile's q, pairs over E
  uint32_t* g2 = q2 + kR * ep;                                       // the tile's dO, pairs over E
  uint32_t* qi = g2 + kR * ep;                                       // q, row pairs interleaved
  uint32_t* gi = qi + kRP * eb;                                      // dO, row pairs interleaved
  uint32_t* dsT = gi + kRP * eb;                                     // dS^T: key j's row pairs
  uint32_t* pT = dsT + ldk * kRP;                                    // P^T: key j's row pairs
  uint32_t* ds2 = pT + ldk * kRP;                                    // dS rows, pairs over keys
  uint16_t* rows = reinterpret_cast<uint16_t*>(ds2 + kR * ldp / 2);  // two gathered rows
  float* P = reinterpret_cast<float*>(ds2 + kR * ldp / 2 + e);       // kR x ldp
  float* dS = P + kR * ldp;                                          // kR x ldp
  float* dk = dS + kR * ldp;                                         // tk x eb
  float* dv = dk + D.tk * eb;                                        // tk x eb
  float* dq = dv + D.tk * eb;                                        // kR x eb
  float* obuf = dq + kR * eb;
  float* gbuf = obuf + eb;
  // Row i of head h of x as f32 (O may be f32 or bf16).
  auto row_f32 = [&](const TensorNode* x, int64_t h, int64_t i, float* buf) {
    const Head hx = head_of(x, h);
    return f32_row(hx.base + i * hx.rs, x->dtype, hx.cs, e, buf);
  };
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    const Head qh = head_of(q, h), kh = head_of(k, h), gh = head_of(dout, h);
    pack_pairs_over_e(kh, D.tk, e, k2, ldk, rows);
    pack_pairs_over_e(head_of(v, h), D.tk, e, v2, ldk, rows);
    pack_pairs_over_rows(kh, D.tk, e, eb, kp, rows);
    std::fill(dk, dk + D.tk * eb, 0.0f);
    std::fill(dv, dv + D.tk * eb, 0.0f);
    const GradRows dqh = grad_head(dst, 0, h);
    for (int64_t i0 = 0; i0 < D.tq; i0 += kR) {
      const int nr = int(std::min<int64_t>(kR, D.tq - i0));
      KeyRange kr[kR] = {};  // row r sees keys [lo, hi); rows past nr none
      int64_t n_max = 0;
      for (int r = 0; r < nr; ++r) {
        kr[r] = ranges.row(h, i0 + r);
        n_max = std::max(n_max, kr[r].hi);
      }
      if (n_max == 0) {
        for (int r = 0; r < nr; ++r) std::fill(dqh.row(i0 + r), dqh.row(i0 + r) + e, 0.0f);
        continue;
      }
      const int64_t npm = (n_max + 1) / 2;
      pack_rows_pairs(qh, i0, nr, e, q2, rows);
      pack_rows_pairs(gh, i0, nr, e, g2, rows);
      pack_rows_interleaved(qh, i0, nr, e, eb, qi, rows);
      pack_rows_interleaved(gh, i0, nr, e, eb, gi, rows);
      with_rows(nr, [&]<int R>() {
        scores<R>(q2, ep, k2, ldk, 0, n_max, p.scale, P, ldp);
        scores<R>(g2, ep, v2, ldk, 0, n_max, 1.0f, dS, ldp);  // dp[j] = dO . v_j
      });
      // Per row: p = softmax over its visible keys (0 past them and for a row
      // with none); ds = scale * p (dp - dO . O). Rows past nr weigh 0.
      for (int r = 0; r < kR; ++r) {
        float* pr = P + r * ldp;
        float* dr = dS + r * ldp;
        const int64_t n = kr[r].hi, a = std::min(kr[r].lo, n);
        const float m = row_max(pr + a, n - a);
        if (m == kNegInf) {
          std::fill(pr, pr + 2 * npm, 0.0f);
          std::fill(dr, dr + 2 * npm, 0.0f);
          continue;
        }
        const float l = exp_store_sum(pr + a, n - a, m);
        const float* orow = row_f32(o, h, i0 + r, obuf);
        const float* grow = row_f32(dout, h, i0 + r, gbuf);
        float dsum = 0.0f;
        for (int64_t c = 0; c < e; ++c) dsum += grow[c] * orow[c];
        const float inv = 1.0f / l;
        if (drop.on()) {    // factors f: P holds p f (for dv), ds = p (dp f - D)
          float* f = obuf;  // free until the next row's O
          for (int64_t jb = a; jb < n; jb += eb) {
            const int64_t nb = std::min(eb, n - jb);
            drop.factors(h, i0 + r, jb, nb, f);
            for (int64_t j = jb; j < jb + nb; ++j) {
              const float pj = pr[j] * inv, fj = f[j - jb];
              pr[j] = pj * fj;
              dr[j] = pj * (dr[j] * fj - dsum) * p.scale;
            }
          }
        } else {
          for (int64_t j = a; j < n; ++j) {
            const float pj = pr[j] * inv;
            pr[j] = pj;
            dr[j] = pj * (dr[j] - dsum) * p.scale;
          }
        }
        std::fill(pr, pr + a, 0.0f);  // keys of an earlier packed example
        std::fill(dr, dr + a, 0.0f);
        std::fill(pr + n, pr + 2 * npm, 0.0f);
        std::fill(dr + n, dr + 2 * npm, 0.0f);
      }
      // bf16 copies: dS rows (pairs over keys) for dq, and dS^T, P^T (row pairs
      // per key) for dk and dv.
      for (int r = 0; r < kR; ++r)
        to_bf16(dS + r * ldp, 2 * npm, 2 * npm, reinterpret_cast<uint16_t*>(ds2 + r * (ldp / 2)));
      for (int rp = 0; rp < kRP; ++rp) {
        const int64_t r0 = 2 * rp * ldp, r1 = r0 + ldp;
        interleave_f32(dS + r0, dS + r1, n_max, n_max, dsT + rp * ldk);
        interleave_f32(P + r0, P + r1, n_max, n_max, pT + rp * ldk);
      }
      std::fill(dq, dq + kR * eb, 0.0f);
      with_rows(nr, [&]<int R>() { weighted<R>(ds2, ldp / 2, kp, npm, eb, dq); });
      outer_acc<kRP>(dsT, ldk, qi, n_max, eb, dk);  // dk += scale ds^T q
      outer_acc<kRP>(pT, ldk, gi, n_max, eb, dv);   // dv += p^T dO
      for (int r = 0; r < nr; ++r)
        std::memcpy(dqh.row(i0 + r), dq + r * eb, size_t(e) * sizeof(float));
    }
    const GradRows dkh = grad_head(dst, 1, h), dvh = grad_head(dst, 2, h);
    for (int64_t j = 0; j < D.tk; ++j) {
      std::memcpy(dkh.row(j), dk + j * eb, size_t(e) * sizeof(float));
      std::memcpy(dvh.row(j), dv + j * eb, size_t(e) * sizeof(float));
    }
  }
  return true;
}

#endif

}  // namespace kiln::cpu
