// Packing for the bf16 GEMM path: bf16 operands copied (never rounded: they are
// bf16 already) into the pair-interleaved layouts of gemm_internal.h. Two k of a
// row of A, or of a column of B, become one 32-bit word, so
//   - where the two k are adjacent in memory (A row-major, B a transposed view)
//     the words are read as they are and transposed 16x16 as 32-bit lanes;
//   - where they are a row stride apart (A a transposed view, B row-major)
//     the two lines are interleaved 16 bits at a time by one vpermt2w per 16
//     words (a full 32-column row pair of B in two).
// Masked loads read only elements inside the operand; everything past kc, mc
// or nc in the packed block is written as zero.
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_BF16)
#include <algorithm>

#include "backends/cpu/gemm_transpose_avx512.h"
#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {
namespace {

inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}
inline __mmask32 lanes32(int64_t n) {
  return n >= 32 ? __mmask32(0xffffffffu) : n <= 0 ? __mmask32(0) : __mmask32((1u << n) - 1);
}

// vpermt2w indices interleaving words of two vectors x, y: x0 y0 x1 y1 ...
// starting at word `first` of each (bit 5 of an index picks y).
inline __m512i interleave_index(int first) {
  alignas(64) uint16_t idx[32];
  for (int j = 0; j < 16; ++j) {
    idx[2 * j] = uint16_t(first + j);
    idx[2 * j + 1] = uint16_t(32 + first + j);
  }
  return _mm512_load_si512(idx);
}

// Words (lo[i] | hi[i] << 16) of the first n (<= 16) elements at lo and hi
// (hi null: the pair's second k is past kc, so 0); lanes past n are 0.
inline __m512i pair_words(const uint16_t* lo, const uint16_t* hi, int64_t n, __m512i idx_lo) {
  const __mmask16 m = lanes16(n);
  const __m512i l = _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(m, lo));
  const __m512i h =
      hi ? _mm512_zextsi256_si512(_mm256_maskz_loadu_epi16(m, hi)) : _mm512_setzero_si512();
  return _mm512_permutex2var_epi16(l, idx_lo, h);
}

// lines (<= 16) lines of kn (<= 32) consecutive bf16 each, line l at src + l*ld:
// put(w, v) for each of the ceil(kn/2) pair words w, v holding word w of each
// line in its lane (lanes past `lines` and the odd last element's partner 0).
template <class Put>
inline void transpose_pairs(const uint16_t* src, int64_t ld, int lines, int64_t kn, Put put) {
  __m512 r[16];
  const __mmask32 m = lanes32(kn);
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l)
    r[l] = l < lines ? _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m, src + l * ld))
                     : _mm512_setzero_ps();
  transpose16(r);
  const int words = int((kn + 1) / 2);
  if (words == 16) {
#pragma GCC unroll 16
    for (int w = 0; w < 16; ++w) put(w, _mm512_castps_si512(r[w]));
  } else {
    for (int w = 0; w < words; ++w) put(w, _mm512_castps_si512(r[w]));
  }
}

// Any strides, one element at a time: element (i, k) of a lines x kc block.
template <int L>
void pack_pairs_any(const uint16_t* src, int64_t ls, int64_t ks, int lines, int64_t kc,
                    uint16_t* dst) {
  for (int64_t k = 0; k < round_up(kc, 2); ++k)
    for (int l = 0; l < L; ++l)
      dst[(k / 2) * 2 * L + 2 * l + k % 2] = l < lines && k < kc ? src[l * ls + k * ks] : 0;
}

}  // namespace

void pack_a_bf16(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc,
                 uint16_t* dst) {
  const int64_t kc2 = round_up(kc, 2);
  const __mmask16 mr_mask = lanes16(MR);
  const __m512i idx_lo = interleave_index(0);
  for (int64_t p = 0; p < mc; p += MR, dst += kc2 * MR) {
    const int mv = int(mc - p < MR ? mc - p : MR);
    const uint16_t* src = static_cast<const uint16_t*>(A.data) + (i0 + p) * A.rs + k0 * A.cs;
    if (A.cs == 1) {  // rows contiguous in k: the pairs are words of each row
      for (int64_t kb = 0; kb < kc; kb += 32) {
        uint16_t* d = dst + kb * MR;
        transpose_pairs(src + kb, A.rs, mv, std::min<int64_t>(32, kc - kb), [&](int w, __m512i v) {
          _mm512_mask_storeu_epi32(d + w * 2 * MR, mr_mask, v);
        });
      }
    } else if (A.rs == 1) {  // columns contiguous in i: merge columns k and k+1
#pragma GCC unroll 2
      for (int64_t k = 0; k < kc; k += 2) {
        const uint16_t* hi = k + 1 < kc ? src + (k + 1) * A.cs : nullptr;
        _mm512_mask_storeu_epi32(dst + k * MR, mr_mask, pair_words(src + k * A.cs, hi, mv, idx_lo));
      }
    } else {
      pack_pairs_any<MR>(src, A.rs, A.cs, mv, kc, dst);
    }
  }
}

void pack_b_bf16(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc,
                 uint16_t* dst) {
  constexpr int NV = NR / 16;
  static_assert(NR == 32, "the row-major path interleaves one 32-column row pair per k pair");
  const int64_t kc2 = round_up(kc, 2);
  const __m512i idx_lo = interleave_index(0), idx_hi = interleave_index(16);
  for (int64_t s0 = 0; s0 < nc; s0 += NR, dst += kc2 * NR) {
    const int nv = int(nc - s0 < NR ? nc - s0 : NR);
    const uint16_t* src = static_cast<const uint16_t*>(B.data) + k0 * B.rs + (j0 + s0) * B.cs;
    if (B.cs == 1) {  // rows contiguous in j: merge rows k and k+1, 32 columns at a time
      const __mmask32 m = lanes32(nv);
      const int64_t kfull = kc & ~int64_t(1);  // pairs with both k inside kc
#pragma GCC unroll 2
      for (int64_t k = 0; k < kfull; k += 2) {
        const uint16_t* lo = src + k * B.rs;
        const __m512i l = _mm512_maskz_loadu_epi16(m, lo);
        const __m512i h = _mm512_maskz_loadu_epi16(m, lo + B.rs);
        _mm512_store_si512(dst + k * NR, _mm512_permutex2var_epi16(l, idx_lo, h));
        _mm512_store_si512(dst + k * NR + 32, _mm512_permutex2var_epi16(l, idx_hi, h));
      }
      if (kfull < kc) {  // odd kc: the last k paired with 0
        const __m512i l = _mm512_maskz_loadu_epi16(m, src + kfull * B.rs),
                      z = _mm512_setzero_si512();
        _mm512_store_si512(dst + kfull * NR, _mm512_permutex2var_epi16(l, idx_lo, z));
        _mm512_store_si512(dst + kfull * NR + 32, _mm512_permutex2var_epi16(l, idx_hi, z));
      }
    } else if (B.rs == 1) {  // columns contiguous in k: the pairs are words of each column
      for (int v = 0; v < NV; ++v) {
        const int cols = nv - 16 * v;
        if (cols <= 0) {
          for (int64_t k = 0; k < kc2; k += 2)
            _mm512_store_si512(dst + k * NR + 32 * v, _mm512_setzero_si512());
          continue;
        }
        for (int64_t kb = 0; kb < kc; kb += 32) {
          uint16_t* d = dst + kb * NR + 32 * v;
          transpose_pairs(src + 16 * v * B.cs + kb, B.cs, cols < 16 ? cols : 16,
                          std::min<int64_t>(32, kc - kb),
                          [&](int w, __m512i x) { _mm512_store_si512(d + w * 2 * NR, x); });
        }
      }
    } else {
      pack_pairs_any<NR>(src, B.cs, B.rs, nv, kc, dst);
    }
  }
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_BF16
