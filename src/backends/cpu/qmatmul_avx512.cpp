// AVX-512 quantized kernels: the dequantization of the GEMM path and the
// row-dot path of x @ W^T (few rows of x), in two variants:
// - with AVX512_VNNI (KILN_QMATMUL_VNNI): x rounded to int8 blocks, a pair of W
//   blocks per vpdpbusd (see the comment above XPair);
// - without: a block's quants become two zmm of f32 (Q4_0 nibbles by one
//   vpermps from a 16-entry table, which reads only the index's low 4 bits, so
//   no masking), multiplied with x in f32 and summed lane-wise, then scaled
//   into the accumulator: the exact dequantized product up to f32 rounding.
// Both work on up to 4 rows of W at once (4 independent accumulator chains when
// m = 1); each row's operations are the same in any group, so the split over
// threads does not change the result.
#include "backends/cpu/qmatmul_internal.h"

#if defined(KILN_GEMM_AVX512)
#include <algorithm>
#include <cstring>

#include "backends/cpu/intrinsics.h"
#include "backends/cpu/qmatmul_round_x.h"

namespace kiln::cpu::qmatmul_detail {
namespace {

inline __m512 scale_of(const uint8_t* block) {
  short h;  // blocks are 18 or 34 bytes: the scale is not 2-byte aligned
  std::memcpy(&h, block, 2);
  return _mm512_cvtph_ps(_mm256_set1_epi16(h));
}

// Software prefetch distance of the row-dot path. A block is a few vector ops
// for 18 or 34 bytes, so the out-of-order window covers few cache lines and the
// hardware prefetchers alone leave DRAM bandwidth unused (measured on Zen 5,
// SmolLM2-135M's matrices: 4 rows ahead, ~1.3-2.4 KB, reached half of f32
// gemv's GB/s; 8-16 KB ahead reached it).
constexpr int64_t kPrefetchBytes = 8192;

template <DType F>
constexpr int64_t block_bytes() {
  return F == DType::q8_0 ? int64_t(sizeof(BlockQ8_0)) : int64_t(sizeof(BlockQ4_0));
}

// The 32 quants of a block as f32 (values 0..15, values 16..31), unscaled.
template <DType F>
inline __attribute__((always_inline)) void load_quants(const uint8_t* blk, __m512& lo, __m512& hi) {
  if constexpr (F == DType::q8_0) {
    lo = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2))));
    hi = _mm512_cvtepi32_ps(
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18))));
  } else {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    lo = _mm512_permutexvar_ps(q, table);
    hi = _mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table);
  }
}

// The 32 values of a block as (values 0..15, values 16..31), scaled: exact,
// an f16 scale times an int8 or 4-bit value fits f32's mantissa.
template <DType F>
inline __attribute__((always_inline)) void load_block(const uint8_t* blk, __m512& lo, __m512& hi) {
  const __m512 d = scale_of(blk);
  load_quants<F>(blk, lo, hi);
  lo = _mm512_mul_ps(lo, d);
  hi = _mm512_mul_ps(hi, d);
}

// The f16 scales of nc <= 16 consecutive blocks (stride BB bytes from p) as f32
// lanes 0..nc-1 (the others 0). Scalar loads packed into four 64-bit words, then one
// conversion: a gather, or 16-bit stores read back as one vector (a failed
// store-to-load forward), measured slower.
template <int64_t BB>
inline __m512 scales16(const uint8_t* p, int nc) {
  auto scale = [&](int c) {
    uint16_t h;
    std::memcpy(&h, p + c * BB, 2);
    return uint64_t(h);
  };
  // Scales 4q .. 4q+3 in one word (those past nc zero).
  auto word = [&](int q) {
    if (4 * q + 4 <= nc)
      return scale(4 * q) | scale(4 * q + 1) << 16 | scale(4 * q + 2) << 32 |
             scale(4 * q + 3) << 48;
    uint64_t w = 0;
    for (int c = 4 * q; c < nc; ++c) w |= scale(c) << (16 * (c % 4));
    return w;
  };
  const __m128i lo = _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(word(0))), int64_t(word(1)), 1);
  const __m128i hi = _mm_insert_epi64(_mm_cvtsi64_si128(int64_t(word(2))), int64_t(word(3)), 1);
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1));
}

// R rows of W (from row j) against M rows of x. Per block: the 32 products of
// quants and x summed lane-wise into 16 (a mul and an FMA), then scaled into the
// accumulator (an FMA with the scale broadcast from memory). The scales of 16
// blocks are converted together, so a block costs 7 vector ops for M = 1.
template <DType F, int R, int M>
void dot_group(const QuantMatrix& W, int64_t j, const float* x, int64_t ldx, float* y,
               int64_t ldy) {
  constexpr int64_t bb = block_bytes<F>();
  const int64_t nb = W.cols / kQuantBlock;
  const uint8_t* rows[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) rows[r] = row_ptr(W, j + r);
  __m512 acc[M][R];
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  alignas(64) float d[R][16];
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int nc = int(std::min<int64_t>(16, nb - b0));
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm512_store_ps(d[r], scales16<bb>(rows[r] + b0 * bb, nc));
    for (int c = 0; c < nc; ++c) {
      const int64_t b = b0 + c;
      __m512 xl[M], xh[M];
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i) {
        xl[i] = _mm512_loadu_ps(x + i * ldx + b * 32);
        xh[i] = _mm512_loadu_ps(x + i * ldx + b * 32 + 16);
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(rows[r] + b * bb + kPrefetchBytes), _MM_HINT_T0);
        __m512 lo, hi;
        load_quants<F>(rows[r] + b * bb, lo, hi);
        const __m512 dv = _mm512_set1_ps(d[r][c]);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
          acc[i][r] =
              _mm512_fmadd_ps(_mm512_fmadd_ps(hi, xh[i], _mm512_mul_ps(lo, xl[i])), dv, acc[i][r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) y[i * ldy + j + r] = _mm512_reduce_add_ps(acc[i][r]);
}

// Rows [j0, j1) of W against M rows of x: R rows of W at a time, then one.
template <DType F, int R, int M>
void dot_range(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  int64_t j = j0;
  for (; j + R <= j1; j += R) dot_group<F, R, M>(W, j, x, ldx, y, ldy);
  for (; j < j1; ++j) dot_group<F, 1, M>(W, j, x, ldx, y, ldy);
}

template <DType F>
void dot_rows_f(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
                int64_t j0, int64_t j1) {
  for (int64_t i = 0; i < m; i += 4) {  // 4 rows of x at a time, then the rest
    const float* xi = x + i * ldx;
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(4, m - i)) {
      case 1: dot_range<F, 4, 1>(W, xi, ldx, yi, ldy, j0, j1); break;
      case 2: dot_range<F, 2, 2>(W, xi, ldx, yi, ldy, j0, j1); break;
      case 3: dot_range<F, 2, 3>(W, xi, ldx, yi, ldy, j0, j1); break;
      default: dot_range<F, 2, 4>(W, xi, ldx, yi, ldy, j0, j1); break;
    }
  }
}

#if defined(KILN_QMATMUL_VNNI)
// The VNNI row-dot path (x @ W^T for m <= 4): each row of x is rounded once to
// int8 blocks of 32 (scale dx = max|x| / 127, q = round(x / dx)), then a pair
// of W blocks times a pair of x blocks is one vpdpbusd (64 byte products summed
// by 4 into 16 int32 lanes), converted to f32 and scaled by dw * dx. The x
// bytes of a pair are laid out in the order the W bytes come out of their
// unpacking, so W needs no shuffle:
//   Q4_0: W nibbles [A lo | B lo | A hi | B hi] (16 bytes each) are the unsigned
//         operand, x the signed one; the nibbles' +8 offset is taken off by
//         starting the sum at -8 * (sum of the lane's 4 x bytes).
//   Q8_0: x + 128 is the unsigned operand, W [A | B] the signed one; 128 * (sum
//         of the lane's 4 W bytes) is subtracted (another vpdpbusd).
// An odd last block pairs with itself, its partner's x bytes and scales zero.
struct XPair {
  uint8_t q[64];
  int32_t corr[16];  // Q4_0: -8 * sum of the lane's x bytes; Q8_0: 0
  float d[16];       // dx of the lane's block
};
static_assert(sizeof(XPair) == 192);

// Lane l of a pair's 16 int32 sums belongs to block 0 or 1 of the pair.
template <DType F>
constexpr int lane_block(int l) {
  return F == DType::q4_0 ? (l / 4) % 2 : l / 8;
}
// Byte of value v (0..31) of block h (0, 1) of a pair.
template <DType F>
constexpr int pair_byte(int h, int v) {
  return F == DType::q4_0 ? (v < 16 ? 0 : 32) + h * 16 + v % 16 : h * 32 + v;
}

template <DType F>
void quantize_x(const float* x, int64_t nb, XPair* out) {
  for (int64_t p = 0; p < (nb + 1) / 2; ++p) {
    XPair& X = out[p];
    int8_t q[2][32] = {};
    float dx[2] = {0, 0};
    for (int h = 0; h < 2 && 2 * p + h < nb; ++h)
      dx[h] = round_x_block(x + (2 * p + h) * 32, 32, q[h]);
    for (int h = 0; h < 2; ++h)
      for (int v = 0; v < 32; ++v)
        X.q[pair_byte<F>(h, v)] = F == DType::q8_0 ? uint8_t(q[h][v] + 128) : uint8_t(q[h][v]);
    for (int l = 0; l < 16; ++l) {
      int sum = 0;
      for (int u = 0; u < 4; ++u) sum += int8_t(X.q[4 * l + u]);
      X.corr[l] = F == DType::q4_0 ? -8 * sum : 0;
      X.d[l] = dx[lane_block<F>(l)];
    }
  }
}

// The W bytes of blocks a and b (b = a for an odd last block) in pair order.
template <DType F>
inline __attribute__((always_inline)) __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  if constexpr (F == DType::q4_0) {
    const __m256i v = _mm256_inserti128_si256(
        _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 2))),
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 2)), 1);
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(v), _mm256_srli_epi16(v, 4), 1);
    return _mm512_and_si512(z, _mm512_set1_epi8(0x0f));
  } else {
    return _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + 2))),
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2)), 1);
  }
}

// vpermps indices that spread the scales of pair pp of a 16-block chunk over
// its 16 lanes.
template <DType F>
struct PairIndex {
  alignas(64) int32_t idx[8][16];
  constexpr PairIndex() : idx() {
    for (int pp = 0; pp < 8; ++pp)
      for (int l = 0; l < 16; ++l) idx[pp][l] = 2 * pp + lane_block<F>(l);
  }
};
template <DType F>
inline constexpr PairIndex<F> kPairIndex{};

// R rows of W (from row j) against M quantized rows of x (xq[i]: its pairs).
template <DType F, int R, int M>
void vnni_group(const QuantMatrix& W, int64_t j, const XPair* const* xq, float* y, int64_t ldy) {
  constexpr int64_t bb = block_bytes<F>();
  const int64_t nb = W.cols / kQuantBlock;
  const uint8_t* rows[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) rows[r] = row_ptr(W, j + r);
  __m512 acc[M][R];
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 16) {
    const int nc = int(std::min<int64_t>(16, nb - b0));
    __m512 dw16[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) dw16[r] = scales16<bb>(rows[r] + b0 * bb, nc);
    for (int pp = 0; pp < (nc + 1) / 2; ++pp) {
      const int64_t b = b0 + 2 * pp, p = b / 2;
      const int64_t partner = b + 1 < nb ? bb : 0;
      const __m512i idx = _mm512_load_si512(kPairIndex<F>.idx[pp]);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* a = rows[r] + b * bb;
        // Every cache line ahead: a Q8_0 pair spans 68 bytes.
        _mm_prefetch(reinterpret_cast<const char*>(a + kPrefetchBytes), _MM_HINT_T0);
        if constexpr (F == DType::q8_0)
          _mm_prefetch(reinterpret_cast<const char*>(a + bb + kPrefetchBytes), _MM_HINT_T0);
        const __m512i z = load_pair<F>(a, a + partner);
        const __m512 dw = _mm512_permutexvar_ps(idx, dw16[r]);
        __m512i wsum;
        if constexpr (F == DType::q8_0)
          wsum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(char(0x80)), z);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const XPair& X = xq[i][p];
          const __m512i xv = _mm512_load_si512(X.q);
          __m512i sum;
          if constexpr (F == DType::q4_0)
            sum = _mm512_dpbusd_epi32(_mm512_load_si512(X.corr), z, xv);
          else sum = _mm512_sub_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), xv, z), wsum);
          acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum),
                                      _mm512_mul_ps(dw, _mm512_load_ps(X.d)), acc[i][r]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) y[i * ldy + j + r] = _mm512_reduce_add_ps(acc[i][r]);
}

template <DType F, int R, int M>
void vnni_range(const QuantMatrix& W, const XPair* const* xq, float* y, int64_t ldy, int64_t j0,
                int64_t j1) {
  int64_t j = j0;
  for (; j + R <= j1; j += R) vnni_group<F, R, M>(W, j, xq, y, ldy);
  for (; j < j1; ++j) vnni_group<F, 1, M>(W, j, xq, y, ldy);
}

template <DType F>
void vnni_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
               int64_t j0, int64_t j1, ThreadCtx& t) {
  const int64_t nb = W.cols / kQuantBlock, np = (nb + 1) / 2;
  auto* xq = static_cast<XPair*>(t.scratch(size_t(m * np) * sizeof(XPair)));
  for (int64_t i = 0; i < m; ++i) quantize_x<F>(x + i * ldx, nb, xq + i * np);
  for (int64_t i = 0; i < m; i += 4) {  // 4 rows of x at a time, then the rest
    const XPair* rows[4];
    for (int64_t u = 0; u < 4; ++u) rows[u] = xq + std::min(i + u, m - 1) * np;
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(4, m - i)) {
      case 1: vnni_range<F, 4, 1>(W, rows, yi, ldy, j0, j1); break;
      case 2: vnni_range<F, 2, 2>(W, rows, yi, ldy, j0, j1); break;
      case 3: vnni_range<F, 2, 3>(W, rows, yi, ldy, j0, j1); break;
      default: vnni_range<F, 2, 4>(W, rows, yi, ldy, j0, j1); break;
    }
  }
}
#endif  // KILN_QMATMUL_VNNI

template <DType F>
void dequantize_f(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                  int64_t ldd) {
  constexpr int64_t bb = block_bytes<F>();
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = row_ptr(W, j);
    float* out = dst + (j - j0) * ldd;
    for (int64_t b = c0 / kQuantBlock; b < c1 / kQuantBlock; ++b, out += 32) {
      __m512 lo, hi;
      load_block<F>(row + b * bb, lo, hi);
      _mm512_storeu_ps(out, lo);
      _mm512_storeu_ps(out + 16, hi);
    }
  }
}

}  // namespace

void dot_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
              int64_t j0, int64_t j1, ThreadCtx& t) {
#if defined(KILN_QMATMUL_VNNI)
  if (W.format == DType::q8_0) vnni_rows<DType::q8_0>(W, x, ldx, y, ldy, m, j0, j1, t);
  else vnni_rows<DType::q4_0>(W, x, ldx, y, ldy, m, j0, j1, t);
#else
  if (W.format == DType::q8_0) dot_rows_f<DType::q8_0>(W, x, ldx, y, ldy, m, j0, j1);
  else dot_rows_f<DType::q4_0>(W, x, ldx, y, ldy, m, j0, j1);
#endif
}

void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd) {
  if (W.format == DType::q8_0) dequantize_f<DType::q8_0>(W, j0, j1, c0, c1, dst, ldd);
  else dequantize_f<DType::q4_0>(W, j0, j1, c0, c1, dst, ldd);
}

}  // namespace kiln::cpu::qmatmul_detail

#endif  // KILN_GEMM_AVX512
