// AVX-512 GEMM micro-kernels: MR x NR = 14 x 32 (two zmm per row of C), f32
// (vfmadd) and, with AVX512_BF16, bf16 pairs (vdpbf16ps).
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_AVX512)
#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {
namespace {

constexpr int NV = NR / 16;
static_assert(NR % 16 == 0);

// Stores the accumulators into C: + the old C (kAdd), + the bias row (kBias),
// full tiles unmasked.
template <bool kAdd, bool kFull, bool kBias>
inline __attribute__((always_inline)) void store_tile(__m512 (&acc)[MR][NV], float* c, int64_t ldc,
                                                      int m, int n, const float* bias) {
  __mmask16 mk[NV];
#pragma GCC unroll 4
  for (int v = 0; v < NV; ++v) {
    const int r = n - 16 * v;
    mk[v] = kFull || r >= 16 ? __mmask16(0xffff) : r <= 0 ? __mmask16(0) : __mmask16((1u << r) - 1);
  }
  __m512 bv[NV];
  if constexpr (kBias) {
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v)
      bv[v] = kFull ? _mm512_loadu_ps(bias + 16 * v) : _mm512_maskz_loadu_ps(mk[v], bias + 16 * v);
  }
#pragma GCC unroll 16
  for (int i = 0; i < MR; ++i) {
    if (!kFull && i >= m) break;
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) {
      float* p = c + i * ldc + 16 * v;
      __m512 x = acc[i][v];
      if constexpr (kAdd)
        x = _mm512_add_ps(x, kFull ? _mm512_loadu_ps(p) : _mm512_maskz_loadu_ps(mk[v], p));
      if constexpr (kBias) x = _mm512_add_ps(x, bv[v]);
      if constexpr (kFull) _mm512_storeu_ps(p, x);
      else _mm512_mask_storeu_ps(p, mk[v], x);
    }
  }
}

template <bool kFull>
inline __attribute__((always_inline)) void store_tile(__m512 (&acc)[MR][NV], float* c, int64_t ldc,
                                                      int m, int n, bool add_c, const float* bias) {
  if (add_c) {
    if (bias) store_tile<true, kFull, true>(acc, c, ldc, m, n, bias);
    else store_tile<true, kFull, false>(acc, c, ldc, m, n, bias);
  } else {
    if (bias) store_tile<false, kFull, true>(acc, c, ldc, m, n, bias);
    else store_tile<false, kFull, false>(acc, c, ldc, m, n, bias);
  }
}

// The tile's first R rows (R = MR, or the m of a panel with fewer rows: its
// padding rows are neither multiplied nor stored). Each row's sums are the
// same whatever R is.
template <int R>
void kernel_rows(int64_t kc, const float* __restrict a, const float* __restrict b, float* c,
                 int64_t ldc, int m, int n, bool add_c, const float* bias) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();

  // Pull the C tile towards L1 while the k loop runs.
  for (int i = 0; i < m; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + NR - 1), _MM_HINT_T0);
  }

#pragma GCC unroll 4
  for (int64_t k = 0; k < kc; ++k) {
    __m512 bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = _mm512_load_ps(b + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i]);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(ai, bv[v], acc[i][v]);
    }
    a += MR;
    b += NR;
  }

  if constexpr (R == MR) {
    if (n == NR) return store_tile<true>(acc, c, ldc, m, n, add_c, bias);
  }
  store_tile<false>(acc, c, ldc, m, n, add_c, bias);
}

// Calls f.template operator()<R>() for R = m in [1, MR].
template <int R = 1, class F>
inline __attribute__((always_inline)) void with_rows(int m, F&& f) {
  if constexpr (R < MR) {
    if (m == R) return f.template operator()<R>();
    return with_rows<R + 1>(m, f);
  } else {
    f.template operator()<MR>();
  }
}

}  // namespace

void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc,
            int m, int n, bool add_c, const float* bias) {
  if (m == MR) return kernel_rows<MR>(kc, a, b, c, ldc, m, n, add_c, bias);
  with_rows(m, [&]<int R>() { kernel_rows<R>(kc, a, b, c, ldc, m, n, add_c, bias); });
}

#if defined(KILN_GEMM_BF16)
// Like kernel, over k in pairs: per pair one 32-bit broadcast of A per row and
// one vdpbf16ps per zmm of B. Each lane adds a0*b0 + a1*b1 to its f32
// accumulator; the products are exact in f32 (8-bit significands), so this is
// f32 accumulation of exact products, as oneDNN's and PyTorch's bf16 matmul.
// The instruction treats bf16 subnormal inputs as zero and rounds to nearest
// even whatever MXCSR says.
namespace {
template <int R>
void kernel_bf16_rows(int64_t kc, const uint16_t* __restrict a, const uint16_t* __restrict b,
                      float* c, int64_t ldc, int m, int n, bool add_c, const float* bias) {
  __m512 acc[MR][NV];
#pragma GCC unroll 16
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();

  for (int i = 0; i < m; ++i) {
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(c + i * ldc + NR - 1), _MM_HINT_T0);
  }

  const int64_t pairs = (kc + 1) / 2;
#pragma GCC unroll 4
  for (int64_t p = 0; p < pairs; ++p) {
    __m512bh bv[NV];
#pragma GCC unroll 4
    for (int v = 0; v < NV; ++v) bv[v] = (__m512bh)_mm512_load_si512(b + 32 * v);
#pragma GCC unroll 16
    for (int i = 0; i < R; ++i) {
      int32_t w;
      __builtin_memcpy(&w, a + 2 * i, 4);
      const __m512bh ai = (__m512bh)_mm512_set1_epi32(w);
#pragma GCC unroll 4
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_dpbf16_ps(acc[i][v], ai, bv[v]);
    }
    a += 2 * MR;
    b += 2 * NR;
  }

  if constexpr (R == MR) {
    if (n == NR) return store_tile<true>(acc, c, ldc, m, n, add_c, bias);
  }
  store_tile<false>(acc, c, ldc, m, n, add_c, bias);
}
}  // namespace

void kernel_bf16(int64_t kc, const uint16_t* __restrict a, const uint16_t* __restrict b, float* c,
                 int64_t ldc, int m, int n, bool add_c, const float* bias) {
  if (m == MR) return kernel_bf16_rows<MR>(kc, a, b, c, ldc, m, n, add_c, bias);
  with_rows(m, [&]<int R>() { kernel_bf16_rows<R>(kc, a, b, c, ldc, m, n, add_c, bias); });
}
#endif  // KILN_GEMM_BF16

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_AVX512
