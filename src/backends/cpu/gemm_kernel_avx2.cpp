// AVX2 + FMA GEMM micro-kernel: MR x NR = 6 x 16 (12 ymm accumulators).
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_AVX2)
#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {
namespace {

constexpr int NV = NR / 8;
static_assert(NR % 8 == 0);

inline __m256i lane_mask(int r) {  // lanes < r all ones
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(r), idx);
}

}  // namespace

void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc,
            int m, int n, bool add_c, const float* bias) {
  __m256 acc[MR][NV];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();

  for (int i = 0; i < m; ++i) _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);

#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m256 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm256_load_ps(b + 8 * v);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 ai = _mm256_broadcast_ss(a + i);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    a += MR;
    b += NR;
  }

  if (m == MR && n == NR) {
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i)
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) {
        float* p = c + i * ldc + 8 * v;
        __m256 x = acc[i][v];
        if (add_c) x = _mm256_add_ps(x, _mm256_loadu_ps(p));
        if (bias) x = _mm256_add_ps(x, _mm256_loadu_ps(bias + 8 * v));
        _mm256_storeu_ps(p, x);
      }
    return;
  }
  __m256i mk[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) mk[v] = lane_mask(n - 8 * v);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    if (i >= m) break;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = c + i * ldc + 8 * v;
      __m256 x = acc[i][v];
      if (add_c) x = _mm256_add_ps(x, _mm256_maskload_ps(p, mk[v]));
      if (bias) x = _mm256_add_ps(x, _mm256_maskload_ps(bias + 8 * v, mk[v]));
      _mm256_maskstore_ps(p, mk[v], x);
    }
  }
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_AVX2
