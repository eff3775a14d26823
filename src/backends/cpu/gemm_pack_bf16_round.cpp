// Packing for the bf16 GEMM path from f32 operands that the product reads
// rounded to bf16 (GemmOperand::round_bf16): the same pair-interleaved layouts as
// gemm_pack_bf16.cpp, each element rounded by vcvtne2ps2bf16 (nearest even, NaN
// kept quiet, as a cast to bf16 rounds, but subnormal inputs read as zero:
// gemm_convert.h's f32_to_bf16_daz). vdpbf16ps reads bf16 subnormals as zero
// anyway, so the product equals the one over a bf16 copy except where an f32
// subnormal would round up to the least normal bf16. The copy is never
// written: the cast of a weight or of a gradient that feeds only matmuls costs
// no pass over memory (Graph::fold_bf16_casts).
#include "backends/cpu/gemm_convert.h"
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

inline __m512 load16(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(lanes16(n), p); }

// Words (x[i] | y[i] << 16) of the first n floats of x and y, rounded (y
// null: the pair's second k is past kc): both converted by one vcvtne2ps2bf16
// (x's to the low 16 halves, y's to the high 16), then interleaved.
inline __m512i pair_words(const float* x, const float* y, int64_t n) {
  alignas(64) static constexpr uint16_t kInterleave[32] = {
      0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
      8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
  const __m512 hi = y ? load16(y, n) : _mm512_setzero_ps();
  const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, load16(x, n));
  return _mm512_permutexvar_epi16(_mm512_load_si512(kInterleave), both);
}

// The first n (<= 32) floats at p rounded, as 16 words of consecutive pairs
// (word w = p[2w] | p[2w + 1] << 16; past n zero): vcvtne2ps2bf16 gives
// exactly that order.
inline __m512 pairs_along(const float* p, int64_t n) {
  return (__m512)_mm512_cvtne2ps_pbh(load16(p + 16, n - 16), load16(p, n));
}

// lines (<= 16) lines of kn (<= 32) consecutive floats each, line l at src +
// l*ld: put(w, v) for each of the ceil(kn/2) pair words w, v holding word w of
// each line in its lane (lanes past `lines` 0).
template <class Put>
inline void transpose_pairs(const float* src, int64_t ld, int lines, int64_t kn, Put put) {
  __m512 r[16];
#pragma GCC unroll 16
  for (int l = 0; l < 16; ++l)
    r[l] = l < lines ? pairs_along(src + l * ld, kn) : _mm512_setzero_ps();
  transpose16(r);
  const int words = int((kn + 1) / 2);
  for (int w = 0; w < words; ++w) put(w, _mm512_castps_si512(r[w]));
}

// Any strides, one element at a time: element (l, k) of a lines x kc block.
template <int L>
void pack_pairs_any(const float* src, int64_t ls, int64_t ks, int lines, int64_t kc,
                    uint16_t* dst) {
  for (int64_t k = 0; k < round_up(kc, 2); ++k)
    for (int l = 0; l < L; ++l)
      dst[(k / 2) * 2 * L + 2 * l + k % 2] =
          l < lines && k < kc ? f32_to_bf16_daz(src[l * ls + k * ks]) : 0;
}

}  // namespace

void pack_a_bf16_round(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc,
                       uint16_t* dst) {
  const int64_t kc2 = round_up(kc, 2);
  const __mmask16 mr_mask = lanes16(MR);
  for (int64_t p = 0; p < mc; p += MR, dst += kc2 * MR) {
    const int mv = int(mc - p < MR ? mc - p : MR);
    const float* src = static_cast<const float*>(A.data) + (i0 + p) * A.rs + k0 * A.cs;
    if (A.cs == 1) {  // rows contiguous in k: pairs along each row, then transposed
      for (int64_t kb = 0; kb < kc; kb += 32) {
        uint16_t* d = dst + kb * MR;
        transpose_pairs(src + kb, A.rs, mv, std::min<int64_t>(32, kc - kb), [&](int w, __m512i v) {
          _mm512_mask_storeu_epi32(d + w * 2 * MR, mr_mask, v);
        });
      }
    } else if (A.rs == 1) {  // columns contiguous in i: merge columns k and k+1
      for (int64_t k = 0; k < kc; k += 2) {
        const float* hi = k + 1 < kc ? src + (k + 1) * A.cs : nullptr;
        _mm512_mask_storeu_epi32(dst + k * MR, mr_mask, pair_words(src + k * A.cs, hi, mv));
      }
    } else {
      pack_pairs_any<MR>(src, A.rs, A.cs, mv, kc, dst);
    }
  }
}

void pack_b_bf16_round(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc,
                       uint16_t* dst) {
  constexpr int NV = NR / 16;
  const int64_t kc2 = round_up(kc, 2);
  for (int64_t s0 = 0; s0 < nc; s0 += NR, dst += kc2 * NR) {
    const int nv = int(nc - s0 < NR ? nc - s0 : NR);
    const float* src = static_cast<const float*>(B.data) + k0 * B.rs + (j0 + s0) * B.cs;
    if (B.cs == 1) {  // rows contiguous in j: merge rows k and k+1
      for (int64_t k = 0; k < kc; k += 2) {
        const float* lo = src + k * B.rs;
        const float* hi = k + 1 < kc ? lo + B.rs : nullptr;
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          _mm512_store_si512(dst + k * NR + 32 * v,
                             pair_words(lo + 16 * v, hi ? hi + 16 * v : nullptr, nv - 16 * v));
      }
    } else if (B.rs == 1) {  // columns contiguous in k: pairs along each column, transposed
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
