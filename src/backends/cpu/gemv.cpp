// gemv_rows: eight rows at a time, each with its own accumulator (eight
// independent FMA chains hide the FMA latency) over 16-lane loads of the rows
// and of x; a row's sum is reduced in a fixed tree, so its value depends on K
// only. The generic path keeps 8 partial sums per row.
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

// Rows [i, i + R) (R <= 8, the last rows repeated to fill the block).
template <GemmType T, int R>
void block(const char* a, int64_t lda, const float* x, int64_t K, float* y, bool accumulate) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    const __m512 xv = _mm512_loadu_ps(x + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(load16<T>(a + (r * lda + k) * es, 0xffff), xv, acc[r]);
  }
  if (k < K) {
    const __mmask16 m = lanes(K - k);
    const __m512 xv = _mm512_maskz_loadu_ps(m, x + k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
      acc[r] = _mm512_fmadd_ps(load16<T>(a + (r * lda + k) * es, m), xv, acc[r]);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) put(y + r, _mm512_reduce_add_ps(acc[r]), accumulate);
}

template <GemmType T>
void rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
          bool accumulate) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  const char* base = static_cast<const char*>(A.data);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) block<T, 8>(base + i * A.rs * es, A.rs, x, K, y + i, accumulate);
  for (; i < i1; ++i) block<T, 1>(base + i * A.rs * es, A.rs, x, K, y + i, accumulate);
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
