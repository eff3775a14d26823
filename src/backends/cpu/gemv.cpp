// gemv_rows: one row after the other, so that the weights are read as one
// sequential stream (as the bandwidth probe reads): eight rows interleaved
// k-step by k-step reached ~0.85 of the probe's bandwidth on Zen 5, one row
// at a time ~1.0. Four accumulators per row (independent FMA chains over
// 16-lane loads); a row's sum is reduced in a fixed tree, so its value depends
// on K only. The generic path keeps 8 partial sums per row.
#include "backends/cpu/gemv.h"

#include <algorithm>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/gemm_masked_load.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu {
namespace {

using gemm_detail::load_as_f32;

inline void put(float* y, float v, bool accumulate) { *y = accumulate ? *y + v : v; }

#if defined(KILN_GEMM_AVX512)

using gemm_detail::lanes;
using gemm_detail::load16;

// One row's dot product with x: four accumulators over 64-element steps
// (16-lane loads), then 16-element steps and a masked tail into the first;
// the fixed tree ((a0 + a1) + (a2 + a3)) then the lane sum.
template <GemmType T>
float row_dot(const char* a, const float* x, int64_t K) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    a0 = _mm512_fmadd_ps(load16<T>(a + k * es, 0xffff), _mm512_loadu_ps(x + k), a0);
    a1 = _mm512_fmadd_ps(load16<T>(a + (k + 16) * es, 0xffff), _mm512_loadu_ps(x + k + 16), a1);
    a2 = _mm512_fmadd_ps(load16<T>(a + (k + 32) * es, 0xffff), _mm512_loadu_ps(x + k + 32), a2);
    a3 = _mm512_fmadd_ps(load16<T>(a + (k + 48) * es, 0xffff), _mm512_loadu_ps(x + k + 48), a3);
  }
  for (; k < K; k += 16) {
    const __mmask16 m = lanes(std::min<int64_t>(16, K - k));
    a0 = _mm512_fmadd_ps(load16<T>(a + k * es, m), _mm512_maskz_loadu_ps(m, x + k), a0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

template <GemmType T>
void rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
          bool accumulate) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  const char* base = static_cast<const char*>(A.data);
  for (int64_t i = i0; i < i1; ++i) put(y + i, row_dot<T>(base + i * A.rs * es, x, K), accumulate);
}

#else  // portable: 8 partial sums per row

template <GemmType T>
void rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
          bool accumulate) {
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t row = i * A.rs;
    float s[8] = {};
    int64_t k = 0;
    if constexpr (T == GemmType::f32) {
      const float* a = static_cast<const float*>(A.data) + row;
      for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) s[l] += a[k + l] * x[k + l];
    } else {
      for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) s[l] += load_as_f32(A.data, T, row + k + l) * x[k + l];
    }
    for (int l = 0; k + l < K; ++l) s[l] += load_as_f32(A.data, T, row + k + l) * x[k + l];
    put(y + i, ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])), accumulate);
  }
}

#endif

}  // namespace

void gemv_rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
               bool accumulate) {
  switch (A.type) {
    case GemmType::f32: return rows<GemmType::f32>(A, x, K, y, i0, i1, accumulate);
    case GemmType::f16: return rows<GemmType::f16>(A, x, K, y, i0, i1, accumulate);
    case GemmType::bf16: return rows<GemmType::bf16>(A, x, K, y, i0, i1, accumulate);
  }
}

}  // namespace kiln::cpu
