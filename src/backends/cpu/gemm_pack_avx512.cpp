// AVX-512 packing fast paths for unit-stride operands (row-major and
// transposed views), with f16 / bf16 -> f32 conversion in registers. The
// transposing cases go through 16x16 in-register transposes.
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/gemm_transpose_avx512.h"
#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {
namespace {

inline __mmask16 lanes(int n) {
  return n >= 16 ? __mmask16(0xffff) : n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1);
}

// Loads n (0..16) consecutive elements as f32; lanes past n are 0.
template <GemmType T>
inline __m512 load_n(const void* p, int n);

template <>
inline __m512 load_n<GemmType::f32>(const void* p, int n) {
  if (n >= 16) return _mm512_loadu_ps(p);
  return _mm512_maskz_loadu_ps(lanes(n), p);
}
template <>
inline __m512 load_n<GemmType::f16>(const void* p, int n) {
  const __m256i h = n >= 16 ? _mm256_loadu_si256(static_cast<const __m256i*>(p))
                            : _mm256_maskz_loadu_epi16(lanes(n), p);
  return _mm512_cvtph_ps(h);
}
template <>
inline __m512 load_n<GemmType::bf16>(const void* p, int n) {
  const __m256i h = n >= 16 ? _mm256_loadu_si256(static_cast<const __m256i*>(p))
                            : _mm256_maskz_loadu_epi16(lanes(n), p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <GemmType T>
constexpr int64_t elem_size() {
  return T == GemmType::f32 ? 4 : 2;
}

// Reads a rows x cols block (rows, cols <= 16) whose rows are contiguous
// (row r at src + r*ld elements), transposes it and calls put(c, v) for each
// column c < cols with v = that column (lanes past `rows` are 0).
template <GemmType T, class Put>
inline void transpose_block(const char* src, int64_t ld_bytes, int rows, int cols, Put put) {
  __m512 r[16];
  if (rows == 16 && cols == 16) {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i) r[i] = load_n<T>(src + i * ld_bytes, 16);
  } else {
#pragma GCC unroll 16
    for (int i = 0; i < 16; ++i)
      r[i] = i < rows ? load_n<T>(src + i * ld_bytes, cols) : _mm512_setzero_ps();
  }
  transpose16(r);
  if (cols == 16) {
#pragma GCC unroll 16
    for (int c = 0; c < 16; ++c) put(c, r[c]);
  } else {
    for (int c = 0; c < cols; ++c) put(c, r[c]);
  }
}

template <GemmType T>
void pack_a_t(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  constexpr int64_t es = elem_size<T>();
  const char* base = static_cast<const char*>(A.data);
  const __mmask16 mr_mask = lanes(MR);
  for (int64_t p = 0; p < mc; p += MR, dst += kc * MR) {
    const int mv = int(mc - p < MR ? mc - p : MR);
    const char* src = base + ((i0 + p) * A.rs + k0 * A.cs) * es;
    if (A.rs == 1) {  // column of the panel contiguous: one load per k
      const int64_t ld = A.cs * es;
      for (int64_t k = 0; k < kc; ++k)
        _mm512_mask_storeu_ps(dst + k * MR, mr_mask, load_n<T>(src + k * ld, mv));
    } else {  // rows contiguous in k: transpose 16-column blocks
      const int64_t ld = A.rs * es;
      for (int64_t kb = 0; kb < kc; kb += 16) {
        const int kn = int(kc - kb < 16 ? kc - kb : 16);
        float* d = dst + kb * MR;
        transpose_block<T>(src + kb * es, ld, mv, kn,
                           [&](int c, __m512 v) { _mm512_mask_storeu_ps(d + c * MR, mr_mask, v); });
      }
    }
  }
}

template <GemmType T>
void pack_b_t(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  constexpr int64_t es = elem_size<T>();
  constexpr int NV = NR / 16;
  const char* base = static_cast<const char*>(B.data);
  for (int64_t s0 = 0; s0 < nc; s0 += NR, dst += kc * NR) {
    const int nv = int(nc - s0 < NR ? nc - s0 : NR);
    const char* src = base + (k0 * B.rs + (j0 + s0) * B.cs) * es;
    if (B.cs == 1) {  // rows contiguous: NV loads per k
      const int64_t ld = B.rs * es;
      for (int64_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v)
          _mm512_store_ps(dst + k * NR + 16 * v,
                          load_n<T>(src + k * ld + 16 * v * es, nv - 16 * v));
      }
    } else {  // columns contiguous in k: transpose 16x16 blocks
      const int64_t ld = B.cs * es;
      for (int v = 0; v < NV; ++v) {
        const int cols = nv - 16 * v;
        if (cols <= 0) {
          for (int64_t k = 0; k < kc; ++k)
            _mm512_store_ps(dst + k * NR + 16 * v, _mm512_setzero_ps());
          continue;
        }
        for (int64_t kb = 0; kb < kc; kb += 16) {
          const int kn = int(kc - kb < 16 ? kc - kb : 16);
          float* d = dst + kb * NR + 16 * v;
          transpose_block<T>(src + (16 * v * B.cs + kb) * es, ld, cols < 16 ? cols : 16, kn,
                             [&](int c, __m512 x) { _mm512_store_ps(d + c * NR, x); });
        }
      }
    }
  }
}

}  // namespace

// (An f32 operand read rounded to bf16 takes the portable code: with
// AVX512_BF16 the bf16 path packs such operands itself, so only mixed products
// get here; without it, the scalar rounding replaces the scalar bf16 copy each
// thread made before.)
bool pack_a_simd(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  if ((A.rs != 1 && A.cs != 1) || A.round_bf16) return false;
  switch (A.type) {
    case GemmType::f32: pack_a_t<GemmType::f32>(A, i0, k0, mc, kc, dst); break;
    case GemmType::f16: pack_a_t<GemmType::f16>(A, i0, k0, mc, kc, dst); break;
    case GemmType::bf16: pack_a_t<GemmType::bf16>(A, i0, k0, mc, kc, dst); break;
  }
  return true;
}

bool pack_b_simd(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  if ((B.rs != 1 && B.cs != 1) || B.round_bf16) return false;
  switch (B.type) {
    case GemmType::f32: pack_b_t<GemmType::f32>(B, k0, j0, kc, nc, dst); break;
    case GemmType::f16: pack_b_t<GemmType::f16>(B, k0, j0, kc, nc, dst); break;
    case GemmType::bf16: pack_b_t<GemmType::bf16>(B, k0, j0, kc, nc, dst); break;
  }
  return true;
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_AVX512
