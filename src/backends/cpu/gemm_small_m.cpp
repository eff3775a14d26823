// GEMM for a few rows of A (M <= kSmallM, e.g. batch-1 inference; or M <=
// kSmallMShortK when K is short, e.g. conv2d's per-image products with O output
// channels) with B rows contiguous: no packing of B; B is streamed row by row
// straight from its storage, once per group of 4 rows of A (a 64-column chunk
// of B stays in L1/L2 between the groups). Each C element is one FMA chain over
// k (then one add of the old C when accumulating, then one of the bias); threads
// split N in chunks of 64 columns.
#include <algorithm>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/gemm_masked_load.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu::gemm_detail {
namespace {

constexpr int64_t kChunk = 64;  // columns per register block

// A[0:M, 0:K] -> a32[i*K + k] in f32.
void convert_a(const GemmOperand& A, int64_t M, int64_t K, float* a32) {
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k)
      a32[i * K + k] = load_as_f32(A.data, A.type, i * A.rs + k * A.cs);
}

#if defined(KILN_GEMM_AVX512)

// C[0:MM, j0:j0+n] for n <= kChunk.
template <GemmType T, int MM>
void chunk(const GemmArgs& g, const float* a32, int64_t j0, int64_t n) {
  constexpr int64_t es = T == GemmType::f32 ? 4 : 2;
  constexpr int NV = int(kChunk / 16);
  const int64_t K = g.K;
  __m512 acc[MM][NV];
  __mmask16 mk[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    mk[v] = lanes(n - 16 * v);
#pragma GCC unroll 4
    for (int i = 0; i < MM; ++i) acc[i][v] = _mm512_setzero_ps();
  }
  const char* b = static_cast<const char*>(g.B.data) + j0 * es;
  const int64_t ldb = g.B.rs * es;
  for (int64_t k = 0; k < K; ++k, b += ldb) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = load16<T>(b + 16 * v * es, mk[v]);
#pragma GCC unroll 4
    for (int i = 0; i < MM; ++i) {
      const __m512 a = _mm512_set1_ps(a32[i * K + k]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, bv[v], acc[i][v]);
    }
  }
#pragma GCC unroll 4
  for (int i = 0; i < MM; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* c = g.C + i * g.ldc + j0 + 16 * v;
      __m512 x = acc[i][v];
      if (g.accumulate) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], c));
      if (g.bias) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(mk[v], g.bias + j0 + 16 * v));
      _mm512_mask_storeu_ps(c, mk[v], x);
    }
  }
}

template <GemmType T>
void run_chunk(const GemmArgs& g, const float* a32, int64_t j0, int64_t n) {
  switch (g.M) {
    case 1: return chunk<T, 1>(g, a32, j0, n);
    case 2: return chunk<T, 2>(g, a32, j0, n);
    case 3: return chunk<T, 3>(g, a32, j0, n);
    default: return chunk<T, 4>(g, a32, j0, n);
  }
}

void do_chunk(const GemmArgs& g, const float* a32, int64_t j0, int64_t n) {
  switch (g.B.type) {
    case GemmType::f32: return run_chunk<GemmType::f32>(g, a32, j0, n);
    case GemmType::f16: return run_chunk<GemmType::f16>(g, a32, j0, n);
    case GemmType::bf16: return run_chunk<GemmType::bf16>(g, a32, j0, n);
  }
}

#else  // portable

template <int MM>
void chunk_any(const GemmArgs& g, const float* a32, int64_t j0, int64_t n) {
  float acc[MM][kChunk] = {};
  float bk[kChunk] = {};
  for (int64_t k = 0; k < g.K; ++k) {
    const int64_t base = k * g.B.rs + j0;
    switch (g.B.type) {
      case GemmType::f32: {
        const float* b = static_cast<const float*>(g.B.data) + base;
        for (int64_t j = 0; j < n; ++j) bk[j] = b[j];
        break;
      }
      case GemmType::f16: {
        const uint16_t* b = static_cast<const uint16_t*>(g.B.data) + base;
        for (int64_t j = 0; j < n; ++j) bk[j] = f16_bits_to_f32(b[j]);
        break;
      }
      case GemmType::bf16: {
        const uint16_t* b = static_cast<const uint16_t*>(g.B.data) + base;
        for (int64_t j = 0; j < n; ++j) bk[j] = bf16_bits_to_f32(b[j]);
        break;
      }
    }
    for (int i = 0; i < MM; ++i) {
      const float a = a32[i * g.K + k];
      for (int64_t j = 0; j < kChunk; ++j) acc[i][j] += a * bk[j];
    }
  }
  for (int i = 0; i < MM; ++i) {
    float* c = g.C + i * g.ldc + j0;
    if (g.accumulate)
      for (int64_t j = 0; j < n; ++j) c[j] += acc[i][j];
    else
      for (int64_t j = 0; j < n; ++j) c[j] = acc[i][j];
    if (g.bias)
      for (int64_t j = 0; j < n; ++j) c[j] += g.bias[j0 + j];
  }
}

void do_chunk(const GemmArgs& g, const float* a32, int64_t j0, int64_t n) {
  switch (g.M) {
    case 1: return chunk_any<1>(g, a32, j0, n);
    case 2: return chunk_any<2>(g, a32, j0, n);
    case 3: return chunk_any<3>(g, a32, j0, n);
    default: return chunk_any<4>(g, a32, j0, n);
  }
}

#endif

}  // namespace

bool small_m_applicable(const GemmArgs& g) {
  const bool few_rows = g.M <= kSmallM || (g.M <= kSmallMShortK && g.K <= kShortK);
  return g.M >= 1 && few_rows && g.B.cs == 1 && g.N >= 1 && g.K >= 1;
}

void gemm_small_m(const GemmArgs& g, int ith, int nth, float* a32) {
  convert_a(g.A, g.M, g.K, a32);
  const int64_t chunks = ceil_div(g.N, kChunk);
  for (int64_t c = chunks * ith / nth; c < chunks * (ith + 1) / nth; ++c) {
    const int64_t j0 = c * kChunk;
    for (int64_t i0 = 0; i0 < g.M; i0 += 4) {  // rows in groups of 4 (the register block)
      GemmArgs rows = g;
      rows.M = std::min<int64_t>(4, g.M - i0);
      rows.C = g.C + i0 * g.ldc;
      do_chunk(rows, a32 + i0 * g.K, j0, std::min(kChunk, g.N - j0));
    }
  }
}

}  // namespace kiln::cpu::gemm_detail
