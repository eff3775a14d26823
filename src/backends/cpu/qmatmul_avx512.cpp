// AVX-512 quantized kernels. A block's 32 quants become two zmm of f32 values
// times the block's scale (exact: an f16 scale times an int8 or a 4-bit value
// fits f32's mantissa), then FMAs with x in f32: the row-dot result is the exact
// dequantized product up to f32 rounding, as in the f32 gemv. Q4_0 nibbles
// become floats by one vpermps from a 16-entry table (it reads only the index's
// low 4 bits, so no masking). The row-dot path keeps two accumulators per (row
// of x, row of W) and works on up to 4 rows of W at once, so 8 FMA chains hide
// the FMA latency when m = 1; each row's operations are the same in any group.
#include "backends/cpu/qmatmul_internal.h"

#if defined(KILN_GEMM_AVX512)
#include <algorithm>
#include <cstring>

#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::qmatmul_detail {
namespace {

inline __m512 scale_of(const uint8_t* block) {
  return _mm512_cvtph_ps(_mm256_set1_epi16(*reinterpret_cast<const short*>(block)));
}

// The 32 values of a block as (values 0..15, values 16..31), scaled.
template <QuantFormat F>
inline __attribute__((always_inline)) void load_block(const uint8_t* blk, __m512& lo, __m512& hi) {
  const __m512 d = scale_of(blk);
  if constexpr (F == QuantFormat::q8_0) {
    const __m512i q0 =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    const __m512i q1 =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 18)));
    lo = _mm512_mul_ps(_mm512_cvtepi32_ps(q0), d);
    hi = _mm512_mul_ps(_mm512_cvtepi32_ps(q1), d);
  } else {
    const __m512 table = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    const __m512i q =
        _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2)));
    lo = _mm512_mul_ps(_mm512_permutexvar_ps(q, table), d);
    hi = _mm512_mul_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), table), d);
  }
}

// Software prefetch distance of the row-dot path. A block is 7 vector ops for 18
// or 34 bytes, so the out-of-order window covers few cache lines and the
// hardware prefetchers alone leave DRAM bandwidth unused (measured on Zen 5,
// SmolLM2-135M's matrices: 4 rows ahead, ~1.3-2.4 KB, reached half of f32
// gemv's GB/s; 8-16 KB ahead reached it).
constexpr int64_t kPrefetchBytes = 8192;

template <QuantFormat F>
constexpr int64_t block_bytes() {
  return F == QuantFormat::q8_0 ? int64_t(sizeof(BlockQ8_0)) : int64_t(sizeof(BlockQ4_0));
}

// The 32 quants of a block as f32 (values 0..15, values 16..31), unscaled.
template <QuantFormat F>
inline __attribute__((always_inline)) void load_quants(const uint8_t* blk, __m512& lo, __m512& hi) {
  if constexpr (F == QuantFormat::q8_0) {
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

// The f16 scales of nc <= 16 consecutive blocks (stride BB bytes from p) as f32
// into out[0:nc]. Scalar loads packed into four 64-bit words, then one
// conversion: a gather, or 16-bit stores read back as one vector (a failed
// store-to-load forward), measured slower.
template <int64_t BB>
inline void scales16(const uint8_t* p, int nc, float* out) {
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
  _mm512_store_ps(out, _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1)));
}

// R rows of W (from row j) against M rows of x. Per block: the 32 products of
// quants and x summed lane-wise into 16 (a mul and an FMA), then scaled into the
// accumulator (an FMA with the scale broadcast from memory). The scales of 16
// blocks are converted together, so a block costs 7 vector ops for M = 1.
template <QuantFormat F, int R, int M>
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
    for (int r = 0; r < R; ++r) scales16<bb>(rows[r] + b0 * bb, nc, d[r]);
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
template <QuantFormat F, int R, int M>
void dot_range(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t j0,
               int64_t j1) {
  int64_t j = j0;
  for (; j + R <= j1; j += R) dot_group<F, R, M>(W, j, x, ldx, y, ldy);
  for (; j < j1; ++j) dot_group<F, 1, M>(W, j, x, ldx, y, ldy);
}

template <QuantFormat F>
void dot_rows_f(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
                int64_t j0, int64_t j1) {
  for (int64_t i = 0; i < m; i += 4) {  // 4 rows of x at a time, then the rest
    const float* xi = x + i * ldx;
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(4, m - i)) {
      case 1: dot_range<F, 4, 1>(W, xi, ldx, yi, ldy, j0, j1); break;
      case 2: dot_range<F, 2, 2>(W, xi, ldx, yi, ldy, j0, j1); break;
      case 3: dot_range<F, 1, 3>(W, xi, ldx, yi, ldy, j0, j1); break;
      default: dot_range<F, 1, 4>(W, xi, ldx, yi, ldy, j0, j1); break;
    }
  }
}

template <QuantFormat F>
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
              int64_t j0, int64_t j1) {
  if (W.format == QuantFormat::q8_0) dot_rows_f<QuantFormat::q8_0>(W, x, ldx, y, ldy, m, j0, j1);
  else dot_rows_f<QuantFormat::q4_0>(W, x, ldx, y, ldy, m, j0, j1);
}

void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd) {
  if (W.format == QuantFormat::q8_0) dequantize_f<QuantFormat::q8_0>(W, j0, j1, c0, c1, dst, ldd);
  else dequantize_f<QuantFormat::q4_0>(W, j0, j1, c0, c1, dst, ldd);
}

}  // namespace kiln::cpu::qmatmul_detail

#endif  // KILN_GEMM_AVX512
