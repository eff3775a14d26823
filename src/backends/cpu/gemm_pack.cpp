// GEMM packing: portable code for any strides and element types, converting to
// f32 on the way. The instruction-set fast paths (pack_*_simd) are tried first.
#include <cstring>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"

namespace kiln::cpu::gemm_detail {
namespace {

struct LoadF32 {
  using E = float;
  static float get(const float* p) { return *p; }
};
// An f32 operand read rounded to bf16 (GemmOperand::round_bf16), widened back.
struct LoadF32RoundBF16 {
  using E = float;
  static float get(const float* p) { return bf16_bits_to_f32(f32_to_bf16_daz(*p)); }
};
struct LoadF16 {
  using E = uint16_t;
  static float get(const uint16_t* p) { return f16_bits_to_f32(*p); }
};
struct LoadBF16 {
  using E = uint16_t;
  static float get(const uint16_t* p) { return bf16_bits_to_f32(*p); }
};

template <class L>
void pack_a_any(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  using E = typename L::E;
  const int64_t rs = A.rs, cs = A.cs;
  for (int64_t p = 0; p < mc; p += MR, dst += kc * MR) {
    const int mv = int(mc - p < MR ? mc - p : MR);
    const E* src = static_cast<const E*>(A.data) + (i0 + p) * rs + k0 * cs;
    if (mv < MR)
      for (int64_t k = 0; k < kc; ++k)
        for (int i = mv; i < MR; ++i) dst[k * MR + i] = 0.0f;
    if (cs == 1) {  // rows contiguous in k: read row by row
      for (int i = 0; i < mv; ++i) {
        const E* s = src + i * rs;
        for (int64_t k = 0; k < kc; ++k) dst[k * MR + i] = L::get(s + k);
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        const E* s = src + k * cs;
        for (int i = 0; i < mv; ++i) dst[k * MR + i] = L::get(s + i * rs);
      }
    }
  }
}

template <class L>
void pack_b_any(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  using E = typename L::E;
  const int64_t rs = B.rs, cs = B.cs;
  for (int64_t s0 = 0; s0 < nc; s0 += NR, dst += kc * NR) {
    const int nv = int(nc - s0 < NR ? nc - s0 : NR);
    const E* src = static_cast<const E*>(B.data) + k0 * rs + (j0 + s0) * cs;
    if (nv < NR)
      for (int64_t k = 0; k < kc; ++k)
        for (int j = nv; j < NR; ++j) dst[k * NR + j] = 0.0f;
    if (rs == 1 && cs != 1) {  // columns contiguous in k: read column by column
      for (int j = 0; j < nv; ++j) {
        const E* s = src + j * cs;
        for (int64_t k = 0; k < kc; ++k) dst[k * NR + j] = L::get(s + k);
      }
    } else {
      for (int64_t k = 0; k < kc; ++k) {
        const E* s = src + k * rs;
        float* d = dst + k * NR;
        if (cs == 1)
          for (int j = 0; j < nv; ++j) d[j] = L::get(s + j);
        else
          for (int j = 0; j < nv; ++j) d[j] = L::get(s + j * cs);
      }
    }
  }
}

}  // namespace

void pack_a(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  if (pack_a_simd(A, i0, k0, mc, kc, dst)) return;
  switch (A.type) {
    case GemmType::f32:
      if (A.round_bf16) return pack_a_any<LoadF32RoundBF16>(A, i0, k0, mc, kc, dst);
      return pack_a_any<LoadF32>(A, i0, k0, mc, kc, dst);
    case GemmType::f16: return pack_a_any<LoadF16>(A, i0, k0, mc, kc, dst);
    case GemmType::bf16: return pack_a_any<LoadBF16>(A, i0, k0, mc, kc, dst);
  }
}

void pack_b(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  if (pack_b_simd(B, k0, j0, kc, nc, dst)) return;
  switch (B.type) {
    case GemmType::f32:
      if (B.round_bf16) return pack_b_any<LoadF32RoundBF16>(B, k0, j0, kc, nc, dst);
      return pack_b_any<LoadF32>(B, k0, j0, kc, nc, dst);
    case GemmType::f16: return pack_b_any<LoadF16>(B, k0, j0, kc, nc, dst);
    case GemmType::bf16: return pack_b_any<LoadBF16>(B, k0, j0, kc, nc, dst);
  }
}

#if !defined(KILN_GEMM_AVX512) && !defined(KILN_GEMM_AVX2)
bool pack_a_simd(const GemmOperand&, int64_t, int64_t, int64_t, int64_t, float*) { return false; }
bool pack_b_simd(const GemmOperand&, int64_t, int64_t, int64_t, int64_t, float*) { return false; }
#endif

}  // namespace kiln::cpu::gemm_detail
