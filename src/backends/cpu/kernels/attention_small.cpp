// ATTENTION and ATTENTION_BACK for small heads: at most kMaxT queries and keys
// and E <= kMaxE (a GPT-sized head: T = 64, E = 32). There the long-sequence
// kernels' fixed costs (packing per tile, key blocks of 256, GQA tiles, thread
// splits of tiles) outweigh the arithmetic; here one thread takes whole heads
// (the heads split over the threads; a head's arithmetic never depends on the
// split, so results are the same for any thread count) and a head's whole
// score tile stays in L1:
//   - q, k, v, dO as f32 rows: the memory itself when it is f32 with unit
//     column stride, else converted once per head; k^T (and v^T backward)
//     transposed into E x ldk by 16 x 16 register transposes, zero past Tk;
//   - per tile of kR query rows, the scores are a register-blocked micro-kernel
//     (kR rows x up to kNV vectors of keys, FMA chains over E) over the key
//     vectors the tile's last row can see (the causal triangle is skipped in
//     whole vectors; keys of earlier packed examples, segment ids, are masked,
//     not skipped: at T <= 64 that costs little), then the softmax of the
//     tile's rows together, then P V
//     (forward) or dq = scale ds k (backward) as a second micro-kernel;
//   - backward keeps the head's P and dS ([Tq, ldk], 32 KiB at T = 64) and
//     forms dk = dS^T q and dv = P^T dO per tile of kRK keys over the rows
//     that see them, so every output row is written once.
// With bf16 q, k, v (and dO) on AVX512_BF16 builds every product is a
// vdpbf16ps chain on bf16 pairs (32-bit words): QK^T and dO V^T pair over E
// (q and dO read in place, k^T and v^T transposed as words; exact products),
// P V and dS K pair over keys, dS^T q and P^T dO over query rows, with P and
// dS rounded to bf16 as attention_bf16.cpp does. The forward saves nothing for
// the backward, which recomputes P (its row max and sum are a small part of a
// head's work at this size). Dropout (AttentionParams::keep < 1) scales the
// weights by their mask factors (DropMask) after the row sums, forward; the
// backward recomputes the factors: dv takes p f and ds = p (dp f - D).
#include "backends/cpu/kernels/attention_small.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/attention_head.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using namespace attn;
using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr int64_t kMaxT = 64, kMaxE = 64;
constexpr int kR = kW >= 16 ? 6 : 4;   // rows of a register tile
constexpr int kNV = kW >= 16 ? 4 : 2;  // vectors per row of a register tile
// Keys per tile of dk = dS^T q and dv = P^T dO when E is at most 2 vectors:
// twice the rows, so each loaded q / dO row serves 24 FMAs.
constexpr int kRK = kW >= 16 ? 12 : kR;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// The register tiles' loops over rows and vectors must be unrolled before
// GCC's scalar replacement, or the accumulator arrays live on the stack (a
// load and a store per FMA).
#define KILN_UNROLL _Pragma("GCC unroll 16")

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__) && \
    defined(__AVX512VL__)
#define KILN_SMALL_PAIRS 1
constexpr bool kHavePairs = true;
#else
constexpr bool kHavePairs = false;
#endif

// Whether t's heads can be read as rows of bf16 pairs (32-bit words): bf16,
// unit column stride, an even E, every other stride and the data 4-aligned.
bool bf16_pairs(const TensorNode* t) {
  const int nd = t->shape.ndim();
  if (!kHavePairs || t->dtype != DType::bf16 || t->stride[nd - 1] != 2 || t->shape[nd - 1] % 2 != 0)
    return false;
  if (reinterpret_cast<uintptr_t>(t->data) % 4 != 0) return false;
  for (int d = 0; d + 1 < nd; ++d)
    if (t->stride[d] % 4 != 0) return false;
  return true;
}

bool small_heads(const Dims& D) {
  return D.tq <= kMaxT && D.tk >= 1 && D.tk <= kMaxT && D.e >= 1 && D.e <= kMaxE;
}

// Calls f.template operator()<N>() for the runtime n in [1, Max].
template <int N, int Max, class F>
void dispatch(int n, F& f) {
  if constexpr (N <= Max) {
    if (n == N) f.template operator()<N>();
    else dispatch<N + 1, Max>(n, f);
  }
}
template <int Max, class F>
void with_n(int n, F&& f) {
  dispatch<1, Max>(n, f);
}

// A head's rows as contiguous f32 (row i at p + i * ld).
struct Rows {
  const float* p;
  int64_t ld;
  const float* row(int64_t i) const { return p + i * ld; }
};

// A head of bf16 pairs (bf16_pairs holds) as rows of 32-bit words.
Rows word_rows(const HeadMat& x) { return {reinterpret_cast<const float*>(x.base), x.rs / 4}; }

#if defined(KILN_SMALL_PAIRS)
inline __m512i widen(__m256i h) { return _mm512_cvtepu16_epi32(h); }
inline __m256i to_bf16(__m512 x) { return (__m256i)_mm512_cvtneps_pbh(x); }

// Rows 2p and 2p + 1 of a bf16 head (bf16_pairs) interleaved into words:
// dst[p * e + c] = x[2p][c] | x[2p + 1][c] << 16 for 2p < n (a missing odd
// row is 0).
void interleave_rows(const HeadMat& x, int64_t n, int64_t e, float* dst) {
  for (int64_t p = 0; 2 * p < n; ++p)
    for (int64_t c = 0; c < e; c += 16) {
      const __mmask16 m = vm::tail_mask(int(e - c));
      const char* r0 = x.base + 2 * p * x.rs + c * 2;
      const __m512i lo = widen(_mm256_maskz_loadu_epi16(m, r0));
      const __m512i hi =
          2 * p + 1 < n ? widen(_mm256_maskz_loadu_epi16(m, r0 + x.rs)) : _mm512_setzero_si512();
      _mm512_mask_storeu_epi32(dst + p * e + c, m, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
    }
}

// Two f32 rows (n floats, a multiple of 16) rounded to bf16 and interleaved:
// dst[j] = bf16(a[j]) | bf16(b[j]) << 16 (b null: 0).
void interleave_f32(const float* a, const float* b, int64_t n, float* dst) {
  for (int64_t j = 0; j < n; j += 16) {
    const __m512i lo = widen(to_bf16(_mm512_loadu_ps(a + j)));
    const __m512i hi = b ? widen(to_bf16(_mm512_loadu_ps(b + j))) : _mm512_setzero_si512();
    _mm512_storeu_si512(dst + j, _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16)));
  }
}

// An f32 row (n floats, a multiple of 16) rounded to bf16 pairs along itself:
// dst[p] = bf16(a[2p]) | bf16(a[2p + 1]) << 16.
void pairs_along(const float* a, int64_t n, float* dst) {
  int64_t j = 0;
  for (; j + 32 <= n; j += 32)
    _mm512_storeu_ps(dst + j / 2, (__m512)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(a + j + 16),
                                                              _mm512_loadu_ps(a + j)));
  if (j < n)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j / 2), to_bf16(_mm512_loadu_ps(a + j)));
}
// dO . O of two rows of bf16 pairs (ew words each): exact products, f32 sums.
float dot_pairs(const float* a, const float* b, int64_t ew) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t c = 0; c < ew; c += 16) {
    const __mmask16 m = vm::tail_mask(int(ew - c));
    acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_maskz_loadu_ps(m, a + c),
                           (__m512bh)_mm512_maskz_loadu_ps(m, b + c));
  }
  return _mm512_reduce_add_ps(acc);
}
#else
float dot_pairs(const float*, const float*, int64_t) { return 0.0f; }
void interleave_rows(const HeadMat&, int64_t, int64_t, float*) {}
void interleave_f32(const float*, const float*, int64_t, float*) {}
void pairs_along(const float*, int64_t, float*) {}
#endif

// n rows of x: the memory itself when it already is f32 with unit column
// stride, else converted into buf (ld e).
Rows f32_rows(const HeadMat& x, int64_t n, int64_t e, float* buf) {
  if (x.dt == DType::f32 && (x.cs == 4 || e == 1) && x.rs % 4 == 0)
    return {reinterpret_cast<const float*>(x.base), x.rs / 4};
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
  if (x.dt == DType::bf16 && x.cs == 2) {  // bf16 is the high half of an f32
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < e; c += 16) {
        const __mmask16 m = vm::tail_mask(int(e - c));
        const __m256i h = _mm256_maskz_loadu_epi16(m, x.base + i * x.rs + c * 2);
        _mm512_mask_storeu_ps(buf + i * e + c, m,
                              _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)));
      }
    return {buf, e};
  }
#endif
  for (int64_t i = 0; i < n; ++i)
    convert(x.base + i * x.rs, x.dt, x.cs, reinterpret_cast<char*>(buf + i * e), DType::f32, 4, e);
  return {buf, e};
}

#if defined(__AVX512F__)
// r[c] = column c of the 16 x 16 block whose rows were r[0..15].
void transpose16(__m512 r[16]) {
  __m512 a[16], b[16];
  for (int k = 0; k < 8; ++k) {  // pairs of rows, per 128-bit lane
    a[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
    a[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
  }
  auto lo = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  auto hi = [](__m512 x, __m512 y) {
    return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(x), _mm512_castps_pd(y)));
  };
  for (int k = 0; k < 4; ++k) {  // b[4k + m], lane L: rows 4k..4k+3 of column 4L + m
    b[4 * k] = lo(a[4 * k], a[4 * k + 2]);
    b[4 * k + 1] = hi(a[4 * k], a[4 * k + 2]);
    b[4 * k + 2] = lo(a[4 * k + 1], a[4 * k + 3]);
    b[4 * k + 3] = hi(a[4 * k + 1], a[4 * k + 3]);
  }
  for (int m = 0; m < 4; ++m) {  // gather lane L of b[m], b[4 + m], b[8 + m], b[12 + m]
    const __m512 d0 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0x88);
    const __m512 e0 = _mm512_shuffle_f32x4(b[m], b[4 + m], 0xDD);
    const __m512 d1 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0x88);
    const __m512 e1 = _mm512_shuffle_f32x4(b[8 + m], b[12 + m], 0xDD);
    r[m] = _mm512_shuffle_f32x4(d0, d1, 0x88);
    r[8 + m] = _mm512_shuffle_f32x4(d0, d1, 0xDD);
    r[4 + m] = _mm512_shuffle_f32x4(e0, e1, 0x88);
    r[12 + m] = _mm512_shuffle_f32x4(e0, e1, 0xDD);
  }
}
#endif

// x^T: dst[c * ld + j] = x[j][c] for j < n, zero for j in [n, ld) (ld a
// multiple of kW).
void transpose(const Rows& x, int64_t n, int64_t e, int64_t ld, float* dst) {
#if defined(__AVX512F__)
  for (int64_t j0 = 0; j0 < ld; j0 += 16)
    for (int64_t c0 = 0; c0 < e; c0 += 16) {
      const int mc = int(std::min<int64_t>(16, e - c0));
      __m512 r[16];
      for (int i = 0; i < 16; ++i)
        r[i] = j0 + i < n ? _mm512_maskz_loadu_ps(vm::tail_mask(mc), x.row(j0 + i) + c0)
                          : _mm512_setzero_ps();
      transpose16(r);
      for (int c = 0; c < mc; ++c) _mm512_storeu_ps(dst + (c0 + c) * ld + j0, r[c]);
    }
#else
  for (int64_t j = 0; j < n; ++j) {
    const float* r = x.row(j);
    for (int64_t c = 0; c < e; ++c) dst[c * ld + j] = r[c];
  }
  for (int64_t c = 0; c < e; ++c) std::fill(dst + c * ld + n, dst + (c + 1) * ld, 0.0f);
#endif
}

// S[r * lds + j0 + ...] = scale * sum_c a[r * lda + c] bt[c * ldb + j0 + ...]
// for r < R and NV whole vectors of keys from j0.
// kPairs: a and bt hold pairs of bf16 (32-bit words, a row's elements 2c and
// 2c + 1 in word c; e counts words), each pair product one vdpbf16ps lane.
template <int R, int NV, bool kPairs>
void scores_at(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t j0, int64_t e,
               float scale, float* S, int64_t lds) {
  VF acc[R][NV];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) KILN_UNROLL
  for (int v = 0; v < NV; ++v) acc[r][v] = vm::c<VF>(0.0f);
  for (int64_t c = 0; c < e; ++c) {
    VF b[NV];
    KILN_UNROLL
    for (int v = 0; v < NV; ++v) b[v] = vm::loadv<VF>(bt + c * ldb + j0 + v * kW);
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const VF x = vm::c<VF>(a[r * lda + c]);
      KILN_UNROLL
      for (int v = 0; v < NV; ++v) {
#if defined(KILN_SMALL_PAIRS)
        if constexpr (kPairs) {
          acc[r][v].v = _mm512_dpbf16_ps(acc[r][v].v, (__m512bh)x.v, (__m512bh)b[v].v);
          continue;
        }
#endif
        acc[r][v] = vm::madd(x, b[v], acc[r][v]);
      }
    }
  }
  const VF vs = vm::c<VF>(scale);
  KILN_UNROLL
  for (int r = 0; r < R; ++r) KILN_UNROLL
  for (int v = 0; v < NV; ++v) vm::store(S + r * lds + j0 + v * kW, acc[r][v] * vs);
}

// The scores of R rows against the first nvk vectors of keys.
template <int R, bool kPairs = false>
void scores(const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t nvk, int64_t e,
            float scale, float* S, int64_t lds) {
  int64_t v0 = 0;
  for (; v0 + kNV <= nvk; v0 += kNV)
    scores_at<R, kNV, kPairs>(a, lda, bt, ldb, v0 * kW, e, scale, S, lds);
  if (v0 < nvk)
    with_n<kNV>(int(nvk - v0), [&]<int NV>() {
      scores_at<R, NV, kPairs>(a, lda, bt, ldb, v0 * kW, e, scale, S, lds);
    });
}

// Scores of a tile on pairs (pairs: a and bt as bf16 pairs, e counting
// words) or on f32.
template <int R>
void tile_scores(bool pairs, const float* a, int64_t lda, const float* bt, int64_t ldb, int64_t nvk,
                 int64_t e, float scale, float* S, int64_t lds) {
  if (kHavePairs && pairs) scores<R, true>(a, lda, bt, ldb, nvk, e, scale, S, lds);
  else scores<R, false>(a, lda, bt, ldb, nvk, e, scale, S, lds);
}

// out[r * ldo + c0 + ...] = f[r] * sum over j in [j0, j1) of
// w[r * wr + j * wj] x[j * ldx + c0 + ...] for r < R and NV vectors of columns
// from c0, the last one m lanes wide (f null: factor 1). kPairs: w and x hold
// bf16 pairs (words), j counts pairs and x's word c pairs two rows' column c.
template <int R, int NV, bool kPairs>
void weighted_at(const float* w, int64_t wr, int64_t wj, const float* x, int64_t ldx, int64_t j0,
                 int64_t j1, int64_t c0, int m, const float* f, float* out, int64_t ldo) {
  VF acc[R][NV];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) KILN_UNROLL
  for (int v = 0; v < NV; ++v) acc[r][v] = vm::c<VF>(0.0f);
  for (int64_t j = j0; j < j1; ++j) {
    VF b[NV];
    const float* xj = x + j * ldx + c0;
    KILN_UNROLL
    for (int v = 0; v + 1 < NV; ++v) b[v] = vm::loadv<VF>(xj + v * kW);
    b[NV - 1] = vm::loadv<VF>(xj + (NV - 1) * kW, m);
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const VF s = vm::c<VF>(w[r * wr + j * wj]);
      KILN_UNROLL
      for (int v = 0; v < NV; ++v) {
#if defined(KILN_SMALL_PAIRS)
        if constexpr (kPairs) {
          acc[r][v].v = _mm512_dpbf16_ps(acc[r][v].v, (__m512bh)s.v, (__m512bh)b[v].v);
          continue;
        }
#endif
        acc[r][v] = vm::madd(s, b[v], acc[r][v]);
      }
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    const VF s = vm::c<VF>(f ? f[r] : 1.0f);
    float* o = out + r * ldo + c0;
    KILN_UNROLL
    for (int v = 0; v + 1 < NV; ++v) vm::store(o + v * kW, acc[r][v] * s);
    vm::store(o + (NV - 1) * kW, acc[r][NV - 1] * s, m);
  }
}

// The weighted sums of R rows over all e columns, kNV vectors at a time.
// (More than kR rows: at most 2 vectors at a time, 24 accumulators.)
template <int R, bool kPairs = false>
void weighted(const float* w, int64_t wr, int64_t wj, const float* x, int64_t ldx, int64_t j0,
              int64_t j1, int64_t e, const float* f, float* out, int64_t ldo) {
  constexpr int kMaxNV = R > kR ? 2 : kNV;
  int64_t c0 = 0;
  for (; c0 + kMaxNV * kW <= e; c0 += kMaxNV * kW)
    weighted_at<R, kMaxNV, kPairs>(w, wr, wj, x, ldx, j0, j1, c0, int(kW), f, out, ldo);
  if (c0 == e) return;
  const int64_t rest = e - c0, nvec = (rest + kW - 1) / kW;
  const int m = int(rest - (nvec - 1) * kW);
  with_n<kMaxNV>(int(nvec), [&]<int NV>() {
    weighted_at<R, NV, kPairs>(w, wr, wj, x, ldx, j0, j1, c0, m, f, out, ldo);
  });
}

// Lane indices 0, 1, ... as floats (masks of a row's first lanes).
alignas(64) constexpr float kLanes[16] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
static_assert(kW <= 16);

// Whether lanes j + 0, 1, ... lie in [lo, hi) (a row's visible keys).
inline auto in_range(VF lanes, int64_t j, float lo, float hi) {
  return [=](VF x, VF other) {
    const float fj = float(j);
    return vm::select(lanes >= vm::c<VF>(lo - fj), vm::select(lanes < vm::c<VF>(hi - fj), x, other),
                      other);
  };
}

// Rows r < R of S (lds apart), scores in [0, nw) (whole vectors) of which
// [lo[r], n[r]) are visible: each becomes exp(s - its max) there and 0
// elsewhere; inv[r] = 1 / its sum (0 when nothing is visible or every visible
// score is -inf: weights 0). lo is 0 but for packed examples (segment ids).
// The rows go together so that their max, exp and sum chains overlap (one
// row's alone is latency bound); each vector is loaded once per pass and
// stored once.
template <int R>
void softmax_rows(float* S, int64_t lds, const int64_t* lo, const int64_t* n, int64_t nw,
                  float* inv) {
  const VF lanes = vm::loadv<VF>(kLanes), ninf = vm::c<VF>(kNegInf), zero = vm::c<VF>(0.0f);
  VF mx[R], vmx[R], sum[R];
  float lim[R];
  KILN_UNROLL
  for (int r = 0; r < R; ++r) mx[r] = ninf;
  for (int64_t j = 0; j < nw; j += kW) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      const VF x = vm::loadv<VF>(S + r * lds + j);
      mx[r] = vm::max(mx[r], in_range(lanes, j, float(lo[r]), float(n[r]))(x, ninf));
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    const float m = vm::hmax(mx[r]);
    const bool none = !(m > kNegInf);
    vmx[r] = vm::c<VF>(none ? 0.0f : m);
    lim[r] = none ? 0.0f : float(n[r]);
    sum[r] = zero;
  }
  for (int64_t j = 0; j < nw; j += kW) {
    KILN_UNROLL
    for (int r = 0; r < R; ++r) {
      float* x = S + r * lds + j;
      const VF p =
          in_range(lanes, j, float(lo[r]), lim[r])(vm::exp(vm::loadv<VF>(x) - vmx[r]), zero);
      vm::store(x, p);
      sum[r] = sum[r] + p;
    }
  }
  KILN_UNROLL
  for (int r = 0; r < R; ++r) {
    const float l = vm::hsum(sum[r]);
    inv[r] = l > 0.0f ? 1.0f / l : 0.0f;
  }
}

template <class F>
void with_rows(int nr, F&& f) {
  with_n<kR>(nr, std::forward<F>(f));
}

}  // namespace

bool attention_small_forward(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const AttentionParams p = op_params<Op::ATTENTION>(*dst);
  const Dims D = dims_of(q, k);
  if (!small_heads(D)) return false;
  if (dst->numel() == 0) return true;
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, 2 * D.tq * D.tk * D.e), 1);
  if (hr.empty()) return true;
  const int64_t e = D.e, ldk = round_up(D.tk, kW), ldp = ldk / 2;
  // bf16 q, k, v: every product on bf16 pairs (P rounded to bf16 for P V).
  const bool pairs = bf16_pairs(q) && bf16_pairs(k) && bf16_pairs(v);
  const int64_t ew = pairs ? e / 2 : e;  // words of a q or k row
  float* kt = static_cast<float*>(
      t.scratch(size_t(e * ldk + 2 * D.tk * e + D.tq * e + kR * ldk + kR * ldp + kR * e + kR) *
                sizeof(float)));
  float* kbuf = kt + e * ldk;
  float* vbuf = kbuf + D.tk * e;  // v as f32, or its row pairs interleaved
  float* qbuf = vbuf + D.tk * e;
  float* S = qbuf + D.tq * e;   // kR x ldk: scores, then exp(s - max)
  float* P2 = S + kR * ldk;     // kR x ldp: those as bf16 pairs
  float* obuf = P2 + kR * ldp;  // kR x e: output rows before a conversion
  float* inv = obuf + kR * e;   // kR: 1 / each row's sum
  const bool f32_out = dst->dtype == DType::f32;
  const int64_t osz = int64_t(dtype_size(dst->dtype));
  char* out = static_cast<char*>(dst->data);
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    // k^T as words of bf16 pairs (q read in place, v's row pairs interleaved)
    // or as f32.
    Rows qr{}, vr{};
    if (pairs) {
      transpose(word_rows(head_of(k, h)), D.tk, ew, ldk, kt);
      qr = word_rows(head_of(q, h));
      interleave_rows(head_of(v, h), D.tk, e, vbuf);
    } else {
      transpose(f32_rows(head_of(k, h), D.tk, e, kbuf), D.tk, e, ldk, kt);
      qr = f32_rows(head_of(q, h), D.tq, e, qbuf);
      vr = f32_rows(head_of(v, h), D.tk, e, vbuf);
    }
    for (int64_t i0 = 0; i0 < D.tq; i0 += kR) {
      const int nr = int(std::min<int64_t>(kR, D.tq - i0));
      char* orows = out + (h * D.tq + i0) * e * osz;
      int64_t lo[kR], n[kR], n_max = 0;  // row r sees keys [lo[r], n[r])
      for (int r = 0; r < nr; ++r) {
        const KeyRange kr = ranges.row(h, i0 + r);
        lo[r] = kr.lo;
        n[r] = kr.hi;
        n_max = std::max(n_max, kr.hi);
      }
      if (n_max == 0) {  // no visible key: zeros (0 bits in f32 and bf16)
        std::memset(orows, 0, size_t(nr * e * osz));
        continue;
      }
      const int64_t nvk = (n_max + kW - 1) / kW;
      float* o = f32_out ? reinterpret_cast<float*>(orows) : obuf;
      with_rows(nr, [&]<int R>() {
        tile_scores<R>(pairs, qr.row(i0), qr.ld, kt, ldk, nvk, ew, p.scale, S, ldk);
        softmax_rows<R>(S, ldk, lo, n, nvk * kW, inv);
        if (drop.on())  // after the sums (inv normalises the undropped weights)
          for (int r = 0; r < R; ++r)
            if (n[r] > lo[r]) drop.apply(h, i0 + r, lo[r], n[r] - lo[r], S + r * ldk + lo[r]);
        if (kHavePairs && pairs) {
          for (int r = 0; r < R; ++r) pairs_along(S + r * ldk, nvk * kW, P2 + r * ldp);
          weighted<R, true>(P2, ldp, 1, vbuf, e, 0, (n_max + 1) / 2, e, inv, o, e);
        } else {
          weighted<R>(S, ldk, 1, vr.p, vr.ld, 0, n_max, e, inv, o, e);
        }
      });
      if (!f32_out)
        convert(reinterpret_cast<const char*>(obuf), DType::f32, 4, orows, dst->dtype, osz, nr * e);
    }
  }
  return true;
}

bool attention_small_backward(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  const TensorNode *o = dst->src[3], *dout = dst->src[4];
  const AttentionParams p = op_params<Op::ATTENTION_BACK>(*dst);
  const Dims D = dims_of(q, k);
  if (!small_heads(D)) return false;
  const Range hr = thread_range(t, D.heads, std::max<int64_t>(1, 5 * D.tq * D.tk * D.e), 1);
  if (hr.empty()) return true;
  const int64_t e = D.e, tq = D.tq, tk = D.tk, ldk = round_up(tk, kW), ldp = ldk / 2;
  const int64_t tq2 = (tq + 1) / 2;  // query row pairs
  // bf16 q, k, v, dO: every product on bf16 pairs (P and dS rounded to bf16);
  // dO . O too where O is bf16 pairs (else on f32 rows).
  const bool pairs = bf16_pairs(q) && bf16_pairs(k) && bf16_pairs(v) && bf16_pairs(dout);
  const bool o_pairs = pairs && bf16_pairs(o);
  const int64_t ew = pairs ? e / 2 : e;  // words of a q, k, v or dO row
  // Scratch: k^T, v^T (e x ldk each), k, v (tk x e), q ((tq + 1) x e: room
  // for an odd row's pair), dO (tq x e) and its pairs ((tq + 1) x e), P and
  // dS (tq x ldk each), O (tq x e), a tile's dS pairs (kR x ldp), dS and P
  // over row pairs (tq2 x ldk each).
  const int64_t floats = 2 * e * ldk + 2 * tk * e + (tq + 1) * e + tq * e + (tq + 1) * e +
                         2 * tq * ldk + tq * e + kR * ldp + 2 * tq2 * ldk + kR * ldk;
  float* kt = static_cast<float*>(t.scratch(size_t(floats) * sizeof(float)));
  float* vt = kt + e * ldk;
  float* kbuf = vt + e * ldk;  // k as f32, or its row pairs interleaved
  float* vbuf = kbuf + tk * e;
  float* qbuf = vbuf + tk * e;        // q as f32, or its row pairs interleaved
  float* gbuf = qbuf + (tq + 1) * e;  // dO as f32
  float* g2 = gbuf + tq * e;          // dO's row pairs interleaved
  float* P = g2 + (tq + 1) * e;       // tq x ldk: the head's softmax weights
  float* dS = P + tq * ldk;           // tq x ldk: dO v^T, then scale * ds
  float* obuf = dS + tq * ldk;        // tq x e: O as f32
  float* ds2 = obuf + tq * e;         // kR x ldp: a tile's dS as pairs over keys
  float* dSp = ds2 + kR * ldp;        // tq2 x ldk: dS as pairs over rows
  float* Pp = dSp + tq2 * ldk;        // tq2 x ldk: P as pairs over rows
  float* F = Pp + tq2 * ldk;          // kR x ldk: a tile's dropout factors
  KeyRanges ranges(dst, D, p);
  const DropMask drop(dst, p, D);
  for (int64_t h = hr.begin; h < hr.end; ++h) {
    // f32 rows, or for pairs k^T, v^T as words (q, dO read in place for the
    // scores) and the row pairs of k, q, dO interleaved for the other products.
    Rows kr{}, qr{}, qs{}, gs{}, gr{}, orows{};
    if (pairs) {
      transpose(word_rows(head_of(k, h)), tk, ew, ldk, kt);
      transpose(word_rows(head_of(v, h)), tk, ew, ldk, vt);
      qs = word_rows(head_of(q, h));
      gs = word_rows(head_of(dout, h));
      interleave_rows(head_of(k, h), tk, e, kbuf);
      interleave_rows(head_of(q, h), tq, e, qbuf);
      interleave_rows(head_of(dout, h), tq, e, g2);
    } else {
      kr = f32_rows(head_of(k, h), tk, e, kbuf);
      qr = f32_rows(head_of(q, h), tq, e, qbuf);
      transpose(kr, tk, e, ldk, kt);
      transpose(f32_rows(head_of(v, h), tk, e, vbuf), tk, e, ldk, vt);
      gr = f32_rows(head_of(dout, h), tq, e, gbuf);
      qs = qr;
      gs = gr;
    }
    if (o_pairs) {
      orows = word_rows(head_of(o, h));
    } else {
      if (pairs) gr = f32_rows(head_of(dout, h), tq, e, gbuf);
      orows = f32_rows(head_of(o, h), tq, e, obuf);
    }
    const GradRows dq = grad_head(dst, 0, h), dk = grad_head(dst, 1, h), dv = grad_head(dst, 2, h);
    // Per query tile: P and scale * ds = scale * p (dp - dO . O) of its rows
    // (0 outside each row's visible keys, up to ldk), and its rows of dq.
    for (int64_t i0 = 0; i0 < tq; i0 += kR) {
      const int nr = int(std::min<int64_t>(kR, tq - i0));
      float* Pt = P + i0 * ldk;
      float* dSt = dS + i0 * ldk;
      int64_t lo[kR], n[kR], n_max = 0;  // row r sees keys [lo[r], n[r])
      for (int r = 0; r < nr; ++r) {
        const KeyRange kr = ranges.row(h, i0 + r);
        lo[r] = kr.lo;
        n[r] = kr.hi;
        n_max = std::max(n_max, kr.hi);
      }
      if (n_max == 0) {
        std::fill(Pt, Pt + nr * ldk, 0.0f);
        std::fill(dSt, dSt + nr * ldk, 0.0f);
        for (int r = 0; r < nr; ++r) std::fill(dq.row(i0 + r), dq.row(i0 + r) + e, 0.0f);
        continue;
      }
      const int64_t nvk = (n_max + kW - 1) / kW, nw = nvk * kW;
      with_rows(nr, [&]<int R>() {
        tile_scores<R>(pairs, qs.row(i0), qs.ld, kt, ldk, nvk, ew, p.scale, Pt, ldk);
        tile_scores<R>(pairs, gs.row(i0), gs.ld, vt, ldk, nvk, ew, 1.0f, dSt, ldk);  // dp = dO v^T
        float inv[R], dsum[R];
        KILN_UNROLL
        for (int r = 0; r < R; ++r) {
          dsum[r] = o_pairs ? dot_pairs(gs.row(i0 + r), orows.row(i0 + r), ew)  // dO . O
                            : dot(gr.row(i0 + r), orows.row(i0 + r), e);
        }
        softmax_rows<R>(Pt, ldk, lo, n, nw, inv);
        const VF lanes = vm::loadv<VF>(kLanes), vs = vm::c<VF>(p.scale), zero = vm::c<VF>(0.0f);
        if (drop.on()) {
          // Dropout factors f (0 outside the visible keys): P holds p f (for
          // dv = (p f)^T dO) and ds = p (dp f - D).
          for (int r = 0; r < R; ++r) {
            float* f = F + r * ldk;
            std::fill(f, f + nw, 0.0f);
            if (n[r] > lo[r]) drop.factors(h, i0 + r, lo[r], n[r] - lo[r], f + lo[r]);
          }
          for (int64_t j = 0; j < nw; j += kW) {
            KILN_UNROLL
            for (int r = 0; r < R; ++r) {
              float* pr = Pt + r * ldk + j;
              float* dr = dSt + r * ldk + j;
              const VF pj = vm::loadv<VF>(pr) * vm::c<VF>(inv[r]);
              const VF fj = vm::loadv<VF>(F + r * ldk + j);
              const VF ds = pj * (vm::loadv<VF>(dr) * fj - vm::c<VF>(dsum[r])) * vs;
              vm::store(pr, pj * fj);
              vm::store(dr, in_range(lanes, j, float(lo[r]), float(n[r]))(ds, zero));
            }
          }
        } else {
          for (int64_t j = 0; j < nw; j += kW) {
            KILN_UNROLL
            for (int r = 0; r < R; ++r) {
              float* pr = Pt + r * ldk + j;
              float* dr = dSt + r * ldk + j;
              const VF pj = vm::loadv<VF>(pr) * vm::c<VF>(inv[r]);
              const VF ds = pj * (vm::loadv<VF>(dr) - vm::c<VF>(dsum[r])) * vs;
              vm::store(pr, pj);
              // p is 0 outside the visible keys, where dp may be anything
              vm::store(dr, in_range(lanes, j, float(lo[r]), float(n[r]))(ds, zero));
            }
          }
        }
        for (int r = 0; r < R; ++r)
          for (int64_t j = nw; j < ldk; j += kW) {
            vm::store(Pt + r * ldk + j, zero);
            vm::store(dSt + r * ldk + j, zero);
          }
        if (kHavePairs && pairs) {
          for (int r = 0; r < R; ++r) pairs_along(dSt + r * ldk, nw, ds2 + r * ldp);
          weighted<R, true>(ds2, ldp, 1, kbuf, e, 0, (n_max + 1) / 2, e, nullptr, dq.row(i0),
                            dq.ld);
        } else {
          weighted<R>(dSt, ldk, 1, kr.p, kr.ld, 0, n_max, e, nullptr, dq.row(i0), dq.ld);
        }
      });
    }
    if (pairs)  // dS and P over row pairs, for dS^T q and P^T dO
      for (int64_t ip = 0; ip < tq2; ++ip) {
        const bool odd = 2 * ip + 1 < tq;
        interleave_f32(dS + 2 * ip * ldk, odd ? dS + (2 * ip + 1) * ldk : nullptr, ldk,
                       dSp + ip * ldk);
        interleave_f32(P + 2 * ip * ldk, odd ? P + (2 * ip + 1) * ldk : nullptr, ldk,
                       Pp + ip * ldk);
      }
    // Per key tile: dk = dS^T q and dv = P^T dO over the rows that see its
    // first key (later keys of the tile have weight 0 in rows that do not).
    const int rk = e <= 2 * kW ? kRK : kR;
    for (int64_t j0 = 0; j0 < tk; j0 += rk) {
      const int nj = int(std::min<int64_t>(rk, tk - j0));
      const int64_t i_lo = p.causal ? std::clamp<int64_t>(j0 - (tk - tq), 0, tq) : 0;
      with_n<kRK>(nj, [&]<int R>() {
        if (kHavePairs && pairs) {
          weighted<R, true>(dSp + j0, 1, ldk, qbuf, e, i_lo / 2, tq2, e, nullptr, dk.row(j0),
                            dk.ld);
          weighted<R, true>(Pp + j0, 1, ldk, g2, e, i_lo / 2, tq2, e, nullptr, dv.row(j0), dv.ld);
        } else {
          weighted<R>(dS + j0, 1, ldk, qr.p, qr.ld, i_lo, tq, e, nullptr, dk.row(j0), dk.ld);
          weighted<R>(P + j0, 1, ldk, gr.p, gr.ld, i_lo, tq, e, nullptr, dv.row(j0), dv.ld);
        }
      });
    }
  }
  return true;
}

}  // namespace kiln::cpu
