// gemv_rows: one row after the other, so that the weights are read as one
// sequential stream (as the bandwidth probe reads): eight rows interleaved
// k-step by k-step reached ~0.85 of the probe's bandwidth on Zen 5, one row
// at a time ~1.0. Four accumulators per row (independent FMA chains over
// 16-lane loads); a row's sum is reduced in a fixed tree, so its value depends
// on K only. The generic path keeps 8 partial sums per row. gemv_rows_multi
// takes a few rows of x at once with the same sums per row.
#include "backends/cpu/gemv.h"

#include <algorithm>
#include <cstring>

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

template <GemmType T>
void rows_multi(const GemmOperand& A, const float* const* x, int64_t M, int64_t K, float* const* y,
                int64_t i0, int64_t i1, bool accumulate) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  const char* base = static_cast<const char*>(A.data);
  for (int64_t i = i0; i < i1; ++i)  // row i stays in L1 for the M dot products
    for (int64_t m = 0; m < M; ++m)
      put(y[m] + i, row_dot<T>(base + i * A.rs * es, x[m], K), accumulate);
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

// MM rows of x against each row of A: lane l of acc[m] sums what rows()'s
// s[l] sums for x[m], in the same order, and the same tree ends it; the loads
// of A are shared and the MM chains are independent. GCC's generic vectors:
// 8 lanes whatever the instruction set (scalar code did not vectorize well).
typedef float V8 __attribute__((vector_size(32)));

template <GemmType T, int MM>
void rows_group(const GemmOperand& A, const float* const* x, int64_t K, float* const* y, int64_t i0,
                int64_t i1, bool accumulate) {
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t row = i * A.rs;
    V8 acc[MM] = {};
    int64_t k = 0;
    for (; k + 8 <= K; k += 8) {
      V8 w;
      if constexpr (T == GemmType::f32) {
        std::memcpy(&w, static_cast<const float*>(A.data) + row + k, sizeof(w));
      } else {
        for (int l = 0; l < 8; ++l) w[l] = load_as_f32(A.data, T, row + k + l);
      }
      for (int m = 0; m < MM; ++m) {
        V8 xv;
        std::memcpy(&xv, x[m] + k, sizeof(xv));
        acc[m] += w * xv;
      }
    }
    for (int m = 0; m < MM; ++m) {
      float t[8];
      std::memcpy(t, &acc[m], sizeof(t));
      for (int l = 0; k + l < K; ++l) t[l] += load_as_f32(A.data, T, row + k + l) * x[m][k + l];
      put(y[m] + i, ((t[0] + t[4]) + (t[1] + t[5])) + ((t[2] + t[6]) + (t[3] + t[7])), accumulate);
    }
  }
}

template <GemmType T>
void rows_multi(const GemmOperand& A, const float* const* x, int64_t M, int64_t K, float* const* y,
                int64_t i0, int64_t i1, bool accumulate) {
  // Groups of up to 4 rows of x (what the registers hold) over blocks of 16
  // rows of A: a block comes from memory once and stays in cache for the others.
  for (int64_t b = i0; b < i1; b += 16) {
    const int64_t e = std::min<int64_t>(b + 16, i1);
    for (int64_t m = 0; m < M; m += 4) {
      switch (std::min<int64_t>(4, M - m)) {
        case 1: rows_group<T, 1>(A, x + m, K, y + m, b, e, accumulate); break;
        case 2: rows_group<T, 2>(A, x + m, K, y + m, b, e, accumulate); break;
        case 3: rows_group<T, 3>(A, x + m, K, y + m, b, e, accumulate); break;
        default: rows_group<T, 4>(A, x + m, K, y + m, b, e, accumulate); break;
      }
    }
  }
}

#endif

}  // namespace

void gemv_rows_multi(const GemmOperand& A, const float* const* x, int64_t M, int64_t K,
                     float* const* y, int64_t i0, int64_t i1, bool accumulate) {
  switch (A.type) {
    case GemmType::f32: return rows_multi<GemmType::f32>(A, x, M, K, y, i0, i1, accumulate);
    case GemmType::f16: return rows_multi<GemmType::f16>(A, x, M, K, y, i0, i1, accumulate);
    case GemmType::bf16: return rows_multi<GemmType::bf16>(A, x, M, K, y, i0, i1, accumulate);
  }
}

void gemv_rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
               bool accumulate) {
  switch (A.type) {
    case GemmType::f32: return rows<GemmType::f32>(A, x, K, y, i0, i1, accumulate);
    case GemmType::f16: return rows<GemmType::f16>(A, x, K, y, i0, i1, accumulate);
    case GemmType::bf16: return rows<GemmType::bf16>(A, x, K, y, i0, i1, accumulate);
  }
}

}  // namespace kiln::cpu
