// 16x16 in-register transpose of 32-bit lanes, shared by the AVX-512 packing
// routines (f32 elements, or pairs of bf16 taken as one 32-bit word).
#pragma once
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {

// In-place transpose of a 16x16 f32 block held as 16 row registers.
inline void transpose16(__m512 (&r)[16]) {
  __m512 t[16];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
#pragma GCC unroll 4
  for (int g = 0; g < 4; ++g) {
    const __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
    const __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
    // r[4g + e]: rows 4g..4g+3, column 4L + e in 128-bit lane L.
    r[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
    r[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
    r[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
    r[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
  }
#pragma GCC unroll 4
  for (int e = 0; e < 4; ++e) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0x44);
    const __m512 u1 = _mm512_shuffle_f32x4(r[e], r[4 + e], 0xee);
    const __m512 u2 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0x44);
    const __m512 u3 = _mm512_shuffle_f32x4(r[8 + e], r[12 + e], 0xee);
    t[0 + e] = _mm512_shuffle_f32x4(u0, u2, 0x88);
    t[4 + e] = _mm512_shuffle_f32x4(u0, u2, 0xdd);
    t[8 + e] = _mm512_shuffle_f32x4(u1, u3, 0x88);
    t[12 + e] = _mm512_shuffle_f32x4(u1, u3, 0xdd);
  }
#pragma GCC unroll 16
  for (int i = 0; i < 16; ++i) r[i] = t[i];
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_AVX512
