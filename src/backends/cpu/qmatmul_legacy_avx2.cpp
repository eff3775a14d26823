// The row-dot path of x @ W^T (decode, m <= 4) for the 32-value block formats
// (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1) on AVX2, as ggml's vec_dot_*_q8_0 / _q8_1:
// each row of x is rounded once to int8 blocks of 32 (round_x_block: step dx
// per block), then per block of W
//   isum = sum of q_w * q_x over the block      (vpmaddubsw + vpmaddwd, exact)
//   y   += (dw * dx) * isum                     (one f32 FMA on 8 lanes)
// with q_w the stored quant: Q8_0's signed bytes (vpmaddubsw takes |q_w| and
// q_x with q_w's sign), the others' unsigned 4- or 5-bit values, whose offset
// (Q4_0: -8, Q5_0: -16) is taken off in the int16 pair sums by subtracting
// offset * (pair sums of q_x), computed once per x block. Q4_1 / Q5_1 add
// their mins as m * (dx * sum of q_x) per block, 8 blocks per FMA in a second
// accumulator. The f16 scales of 8 blocks are converted at once and multiplied
// by the 8 dx; a software prefetch runs 8 KB ahead, as in qmatmul_avx512.cpp.
//
// R rows of W share each x load (independent accumulators, R = 4 for one row
// of x); a row's operations are the same in any group, so the split over
// threads does not change the result. Error: qmatmul.h (|y - W x| <= sum |W|
// dx / 2 + f32 rounding).
#include "backends/cpu/qmatmul_internal.h"

#if defined(KILN_QMATMUL_INT8_AVX2)
#include <algorithm>
#include <cstring>

#include "backends/cpu/intrinsics.h"
#include "backends/cpu/qmatmul_round_x.h"
#include "kiln/error.h"

namespace kiln::cpu::qmatmul_detail {
namespace {

constexpr int64_t kInt8PrefetchBytes = 8192;

// Where a format's fields lie in its block (ggml's block_<type>; -1: none).
struct LegacyLayout {
  int64_t bytes;  // block size
  int qs;         // quants: 32 int8 (Q8_0) or 16 bytes of nibbles (value v low, v + 16 high)
  int qh;         // the 5th bits (bit v of a little-endian uint32 is value v's)
  int min;        // f16 m: value = d q + m
  int offset;     // value = d (q - offset)
};

constexpr LegacyLayout legacy_layout(DType f) {
  switch (f) {
    case DType::q8_0: return {34, 2, -1, -1, 0};
    case DType::q4_0: return {18, 2, -1, -1, 8};
    case DType::q4_1: return {20, 4, -1, 2, 0};
    case DType::q5_0: return {22, 6, 2, -1, 16};
    default: return {24, 8, 4, 2, 0};  // q5_1
  }
}

// One row of x rounded: per block of 32 its quants q (32 bytes), dx (d), dx *
// (sum of q) (ds, for the mins) and offset * (pair sums of q) as int16 (off,
// 16 per block, for the offsets). Arrays are padded to whole groups of 8
// blocks with zeros.
struct XRow {
  int8_t* q;
  float* d;
  float* ds;
  int16_t* off;
};

inline int64_t padded_blocks(int64_t nb) { return (nb + 7) / 8 * 8; }
inline size_t xrow_bytes(int64_t nb) { return size_t(padded_blocks(nb)) * (32 + 4 + 4 + 32); }

XRow round_x_row(const float* x, int64_t nb, int offset, uint8_t* mem) {
  const int64_t np = padded_blocks(nb);
  XRow r{reinterpret_cast<int8_t*>(mem), reinterpret_cast<float*>(mem + np * 32),
         reinterpret_cast<float*>(mem + np * 36), reinterpret_cast<int16_t*>(mem + np * 40)};
  std::memset(mem, 0, xrow_bytes(nb));
  for (int64_t b = 0; b < nb; ++b) {
    int8_t* q = r.q + b * 32;
    r.d[b] = round_x_block(x + b * 32, 32, q);
    int sum = 0;
    for (int v = 0; v < 32; ++v) sum += q[v];
    r.ds[b] = r.d[b] * float(sum);
    if (offset != 0)
      for (int l = 0; l < 16; ++l) r.off[b * 16 + l] = int16_t(offset * (q[2 * l] + q[2 * l + 1]));
  }
  return r;
}

// The f16 at p + c * BB for c < nc (<= 8) as f32 lanes (the others 0): scalar
// loads packed into two 64-bit words, then one conversion.
template <int64_t BB>
inline __m256 scales8(const uint8_t* p, int nc) {
  auto h = [&](int c) {
    uint16_t v;
    std::memcpy(&v, p + c * BB, 2);
    return uint64_t(v);
  };
  auto word = [&](int q) {
    if (4 * q + 4 <= nc)
      return h(4 * q) | h(4 * q + 1) << 16 | h(4 * q + 2) << 32 | h(4 * q + 3) << 48;
    uint64_t w = 0;
    for (int c = 4 * q; c < nc; ++c) w |= h(c) << (16 * (c % 4));
    return w;
  };
  return _mm256_cvtph_ps(_mm_set_epi64x(int64_t(word(1)), int64_t(word(0))));
}

// 32 bits to 32 bytes: byte v is 0xff where bit v is set.
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,  //
                                          2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
  const __m256i bit = _mm256_set1_epi64x(int64_t(0x8040201008040201));
  const __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32(int(bits)), spread);
  return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// A block's 32 quants as bytes, value v at byte v (Q8_0 signed, else unsigned).
template <DType F>
inline __attribute__((always_inline)) __m256i load_quants(const uint8_t* blk) {
  constexpr LegacyLayout L = legacy_layout(F);
  if constexpr (F == DType::q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + L.qs));
  } else {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + L.qs));
    __m256i q = _mm256_and_si256(_mm256_setr_m128i(v, _mm_srli_epi16(v, 4)), _mm256_set1_epi8(15));
    if constexpr (L.qh >= 0) {
      uint32_t bits;
      std::memcpy(&bits, blk + L.qh, 4);
      q = _mm256_or_si256(q, _mm256_and_si256(bits_to_bytes(bits), _mm256_set1_epi8(16)));
    }
    return q;
  }
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// R rows of W (from row j) against M rounded rows of x.
template <DType F, int R, int M>
void int8_group(const QuantMatrix& W, int64_t j, const XRow* xr, float* y, int64_t ldy) {
  constexpr LegacyLayout L = legacy_layout(F);
  constexpr int64_t BB = L.bytes;
  const int64_t nb = W.cols / kQuantBlock;
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* rows[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) rows[r] = row_ptr(W, j + r);
  __m256 acc[M][R], macc[M][R];
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[i][r] = macc[i][r] = _mm256_setzero_ps();
  for (int64_t b0 = 0; b0 < nb; b0 += 8) {
    const int nc = int(std::min<int64_t>(8, nb - b0));
    alignas(32) float sc[R][M][8];  // dw * dx of each block
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 dw = scales8<BB>(rows[r] + b0 * BB, nc);
#pragma GCC unroll 4
      for (int i = 0; i < M; ++i)
        _mm256_store_ps(sc[r][i], _mm256_mul_ps(dw, _mm256_loadu_ps(xr[i].d + b0)));
      if constexpr (L.min >= 0) {
        const __m256 mw = scales8<BB>(rows[r] + b0 * BB + L.min, nc);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i)
          macc[i][r] = _mm256_fmadd_ps(mw, _mm256_loadu_ps(xr[i].ds + b0), macc[i][r]);
      }
    }
    for (int c = 0; c < nc; ++c) {
      const int64_t b = b0 + c;
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = rows[r] + b * BB;
        _mm_prefetch(reinterpret_cast<const char*>(blk + kInt8PrefetchBytes), _MM_HINT_T0);
        const __m256i w = load_quants<F>(blk);
        __m256i wabs = w;
        if constexpr (F == DType::q8_0) wabs = _mm256_sign_epi8(w, w);
#pragma GCC unroll 4
        for (int i = 0; i < M; ++i) {
          const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[i].q + b * 32));
          __m256i p;
          if constexpr (F == DType::q8_0) {
            p = _mm256_maddubs_epi16(wabs, _mm256_sign_epi8(xq, w));
          } else {
            p = _mm256_maddubs_epi16(w, xq);
            if constexpr (L.offset != 0)
              p = _mm256_sub_epi16(
                  p, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr[i].off + b * 16)));
          }
          acc[i][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones)),
                                      _mm256_broadcast_ss(&sc[r][i][c]), acc[i][r]);
        }
      }
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < M; ++i)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
      y[i * ldy + j + r] = L.min >= 0 ? hsum8(acc[i][r]) + hsum8(macc[i][r]) : hsum8(acc[i][r]);
}

// Rows [j0, j1) of W: R at a time, then one.
template <DType F, int R, int M>
void int8_range(const QuantMatrix& W, const XRow* xr, float* y, int64_t ldy, int64_t j0,
                int64_t j1) {
  int64_t j = j0;
  for (; j + R <= j1; j += R) int8_group<F, R, M>(W, j, xr, y, ldy);
  for (; j < j1; ++j) int8_group<F, 1, M>(W, j, xr, y, ldy);
}

template <DType F>
void int8_rows_f(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, int64_t j0, int64_t j1, ThreadCtx& t) {
  const int64_t nb = W.cols / kQuantBlock;
  auto* mem = static_cast<uint8_t*>(t.scratch(size_t(m) * xrow_bytes(nb)));
  XRow xr[kDotMaxRows];
  for (int64_t i = 0; i < m; ++i)
    xr[i] = round_x_row(x + i * ldx, nb, legacy_layout(F).offset, mem + size_t(i) * xrow_bytes(nb));
  for (int64_t i = 0; i < m; i += 4) {  // 4 rows of x at a time (m <= kDotMaxRows = 4)
    float* yi = y + i * ldy;
    switch (std::min<int64_t>(4, m - i)) {
      case 1: int8_range<F, 4, 1>(W, xr + i, yi, ldy, j0, j1); break;
      case 2: int8_range<F, 2, 2>(W, xr + i, yi, ldy, j0, j1); break;
      case 3: int8_range<F, 1, 3>(W, xr + i, yi, ldy, j0, j1); break;
      default: int8_range<F, 1, 4>(W, xr + i, yi, ldy, j0, j1); break;
    }
  }
}

}  // namespace

void int8_avx2_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                    int64_t m, int64_t j0, int64_t j1, ThreadCtx& t) {
  static_assert(kDotMaxRows == 4, "int8_rows_f takes at most 4 rows of x");
  switch (W.format) {
    case DType::q8_0: return int8_rows_f<DType::q8_0>(W, x, ldx, y, ldy, m, j0, j1, t);
    case DType::q4_0: return int8_rows_f<DType::q4_0>(W, x, ldx, y, ldy, m, j0, j1, t);
    case DType::q4_1: return int8_rows_f<DType::q4_1>(W, x, ldx, y, ldy, m, j0, j1, t);
    case DType::q5_0: return int8_rows_f<DType::q5_0>(W, x, ldx, y, ldy, m, j0, j1, t);
    case DType::q5_1: return int8_rows_f<DType::q5_1>(W, x, ldx, y, ldy, m, j0, j1, t);
    default: KILN_ASSERT(false && "int8_avx2_rows: not a 32-value block format");
  }
}

}  // namespace kiln::cpu::qmatmul_detail

#endif  // KILN_QMATMUL_INT8_AVX2
