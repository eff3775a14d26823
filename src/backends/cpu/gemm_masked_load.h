// Masked AVX-512 loads shared by the unpacked small-M / small-N GEMM paths:
// up to 16 elements of f32, f16 or bf16, widened to f32 in registers.
#pragma once
#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"

#include <cstdint>

#include "backends/cpu/gemm.h"

namespace kiln::cpu::gemm_detail {

// The first n lanes (clamped to 0..16).
inline __mmask16 lanes(int64_t n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

template <GemmType T>
inline __m512 load16(const void* p, __mmask16 m) {
  if constexpr (T == GemmType::f32) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, p);
    if constexpr (T == GemmType::f16) return _mm512_cvtph_ps(h);
    else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

}  // namespace kiln::cpu::gemm_detail
#endif
