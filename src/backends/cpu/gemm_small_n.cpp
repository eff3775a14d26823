// GEMM for a few columns of B (N <= kSmallN, e.g. a matrix-vector product or a
// 1-output layer), or a small C with a long K (M*N <= kDotMN, K >= kDotK, e.g.
// conv2d's per-image weight gradient), with A rows contiguous: no packing of A;
// each C element is a dot product of a row of A (streamed from its storage) with
// a column of B (read in place when contiguous f32, else converted once), in
// register blocks of 4 rows x 4 columns. The summation order (16 lanes of FMA chains over
// k, then a fixed reduction tree) depends only on K; threads split M.
#include <algorithm>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/gemm_masked_load.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu::gemm_detail {
namespace {

inline void finish(const GemmArgs& g, int64_t i, int64_t j, float dot) {
  float* c = g.C + i * g.ldc + j;
  const float v = g.accumulate ? dot + *c : dot;
  *c = g.bias ? v + g.bias[j] : v;
}

#if defined(KILN_GEMM_AVX512)

// Rows [i0, i1) of C[:, 0:NN], four rows at a time.
template <GemmType T, int NN>
void rows(const GemmArgs& g, const float* b32, int64_t ldb, int64_t i0, int64_t i1) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  const int64_t K = g.K;
  const char* base = static_cast<const char*>(g.A.data);
  for (int64_t i = i0; i < i1; i += 4) {
    const int mr = int(std::min<int64_t>(4, i1 - i));
    const char* a[4];
    for (int r = 0; r < 4; ++r)
      a[r] = base + (i + std::min(r, mr - 1)) * g.A.rs * es;  // repeat the last row
    __m512 acc[4][NN];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r)
#pragma GCC unroll 4
      for (int j = 0; j < NN; ++j) acc[r][j] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k += 16) {
      const __mmask16 m = lanes(K - k);
      __m512 bv[NN];
#pragma GCC unroll 4
      for (int j = 0; j < NN; ++j) bv[j] = _mm512_maskz_loadu_ps(m, b32 + j * ldb + k);
#pragma GCC unroll 4
      for (int r = 0; r < 4; ++r) {
        const __m512 av = load16<T>(a[r] + k * es, m);
#pragma GCC unroll 4
        for (int j = 0; j < NN; ++j) acc[r][j] = _mm512_fmadd_ps(av, bv[j], acc[r][j]);
      }
    }
    for (int r = 0; r < mr; ++r)
      for (int j = 0; j < NN; ++j) finish(g, i + r, j, _mm512_reduce_add_ps(acc[r][j]));
  }
}

template <GemmType T>
void rows_n(const GemmArgs& g, const float* b32, int64_t ldb, int64_t i0, int64_t i1) {
  switch (g.N) {
    case 1: return rows<T, 1>(g, b32, ldb, i0, i1);
    case 2: return rows<T, 2>(g, b32, ldb, i0, i1);
    case 3: return rows<T, 3>(g, b32, ldb, i0, i1);
    default: return rows<T, 4>(g, b32, ldb, i0, i1);
  }
}

// C[i0:i1, 0:N] for N <= 4; column j of B at b32 + j*ldb.
void do_rows(const GemmArgs& g, const float* b32, int64_t ldb, int64_t i0, int64_t i1) {
  switch (g.A.type) {
    case GemmType::f32: return rows_n<GemmType::f32>(g, b32, ldb, i0, i1);
    case GemmType::f16: return rows_n<GemmType::f16>(g, b32, ldb, i0, i1);
    case GemmType::bf16: return rows_n<GemmType::bf16>(g, b32, ldb, i0, i1);
  }
}

#else  // portable: 8 partial sums per dot product

template <GemmType T>
void rows_any(const GemmArgs& g, const float* b32, int64_t ldb, int64_t i0, int64_t i1) {
  const int64_t K = g.K;
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t row = i * g.A.rs;
    for (int64_t j = 0; j < g.N; ++j) {
      const float* b = b32 + j * ldb;
      float s[8] = {};
      int64_t k = 0;
      for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; ++l) s[l] += load_as_f32(g.A.data, T, row + k + l) * b[k + l];
      for (int l = 0; k + l < K; ++l) s[l] += load_as_f32(g.A.data, T, row + k + l) * b[k + l];
      finish(g, i, j, ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7])));
    }
  }
}

void do_rows(const GemmArgs& g, const float* b32, int64_t ldb, int64_t i0, int64_t i1) {
  switch (g.A.type) {
    case GemmType::f32: return rows_any<GemmType::f32>(g, b32, ldb, i0, i1);
    case GemmType::f16: return rows_any<GemmType::f16>(g, b32, ldb, i0, i1);
    case GemmType::bf16: return rows_any<GemmType::bf16>(g, b32, ldb, i0, i1);
  }
}

#endif

}  // namespace

bool small_n_applicable(const GemmArgs& g) {
  const bool dots = g.N <= kSmallN || (g.K >= kDotK && g.M * g.N <= kDotMN);
  return g.N >= 1 && dots && g.A.cs == 1 && g.M >= 1 && g.K >= 1;
}

void gemm_small_n(const GemmArgs& g, int ith, int nth, float* b32) {
  // B's columns as f32 rows: read in place when they already are (B^T views).
  const float* bcols = b32;
  int64_t ldb = g.K;
  if (g.B.type == GemmType::f32 && g.B.rs == 1) {
    bcols = static_cast<const float*>(g.B.data);
    ldb = g.B.cs;
  } else {
    for (int64_t j = 0; j < g.N; ++j)
      for (int64_t k = 0; k < g.K; ++k)
        b32[j * g.K + k] = load_as_f32(g.B.data, g.B.type, k * g.B.rs + j * g.B.cs);
  }
  for (int64_t j0 = 0; j0 < g.N; j0 += 4) {  // columns in groups of 4 (the register block)
    GemmArgs cols = g;
    cols.N = std::min<int64_t>(4, g.N - j0);
    cols.C = g.C + j0;
    if (g.bias) cols.bias = g.bias + j0;
    do_rows(cols, bcols + j0 * ldb, ldb, g.M * ith / nth, g.M * (ith + 1) / nth);
  }
}

}  // namespace kiln::cpu::gemm_detail
