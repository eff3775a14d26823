// Internals of kiln::cpu::qmatmul shared by the driver (qmatmul.cpp) and the
// kernels: Q8_0 and Q4_0 in the instruction-set specific files
// (qmatmul_portable.cpp, qmatmul_avx512.cpp; exactly one of them defines
// dot_rows and dequantize, chosen at compile time like the GEMM
// micro-kernels), the AVX2 int8 decode of the 32-value blocks in
// qmatmul_legacy_avx2.cpp, every other format in qmatmul_rows.cpp (the
// k-quants' dots: qmatmul_kquant*.cpp). row_dot() below says which kernel
// decodes each format.
#pragma once
#include <cstdint>

#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/qmatmul.h"
#include "backends/cpu/qmatmul_kquant.h"

// x @ W^T's row-dot path rounds x to int8 blocks and multiplies on vpdpbusd
// (qmatmul_avx512.cpp) where the build has AVX512_VNNI.
#if defined(KILN_GEMM_AVX512) && defined(__AVX512VNNI__)
#define KILN_QMATMUL_VNNI 1
#endif
// The 32-value block formats' row-dot path rounds x to int8 blocks and
// multiplies on vpmaddubsw (qmatmul_legacy_avx2.cpp) where the build has AVX2.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define KILN_QMATMUL_INT8_AVX2 1
#endif

namespace kiln::cpu::qmatmul_detail {

// x @ W^T with at most this many rows of x takes the row-dot path.
inline constexpr int64_t kDotMaxRows = 4;

// The row-dot path of x @ W^T (few rows of x): y[i*ldy + j] for i < m and rows
// j in [j0, j1) of W, each row of W read once for all m rows of x. Every y
// element is computed by the same operations whatever [j0, j1) is. May use
// t.scratch().
void dot_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
              int64_t j0, int64_t j1, ThreadCtx& t);

// W[j0:j1, c0:c1] as f32 into dst (row j - j0 at dst + (j - j0) * ldd); c0 and
// c1 multiples of 32. Exact: every quantized value is representable in f32.
void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd);

// Whether dequantize (and, where row_dot says so, dot_rows) reads f (Q8_0,
// Q4_0); the other formats' tiles come from dequantize_any.
constexpr bool has_isa_kernels(DType f) { return f == DType::q8_0 || f == DType::q4_0; }

// The kernel of x @ W^T's row-dot path (m <= kDotMaxRows) for each format:
// the one place that says it (the driver dispatches on it, and
// qmatmul_xwt_rounds_x follows from it).
enum class RowDot {
  isa,  // dot_rows: qmatmul_avx512.cpp (int8 with VNNI, else f32) or qmatmul_portable.cpp (f32)
  int8_avx2,  // int8_avx2_rows: x rounded to int8 blocks of 32 (qmatmul_legacy_avx2.cpp)
  kquant,     // kquant_rows: x rounded to BlockQ8K (qmatmul_kquant*.cpp)
  generic,    // generic_rows: a dequantized row of W in f32
};
constexpr RowDot row_dot(DType f) {
  if (is_k_quant(f)) return RowDot::kquant;
#if defined(KILN_QMATMUL_INT8_AVX2)
  if (f == DType::q4_1 || f == DType::q5_0 || f == DType::q5_1) return RowDot::int8_avx2;
#if !defined(KILN_GEMM_AVX512)  // AVX-512 builds keep their own Q8_0 / Q4_0 kernels
  if (f == DType::q8_0 || f == DType::q4_0) return RowDot::int8_avx2;
#endif
#endif
  return has_isa_kernels(f) ? RowDot::isa : RowDot::generic;
}

// dot_rows for Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 on AVX2: each row of x rounded to
// int8 blocks of 32 (round_x_block), each W block's quants unpacked to bytes and
// multiplied with them by vpmaddubsw / vpmaddwd (exact integers), then scaled
// by the two blocks' scales in f32; Q4_1 / Q5_1's mins add min * dx * (sum of
// the x quants) per block. Defined only where KILN_QMATMUL_INT8_AVX2 is.
void int8_avx2_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                    int64_t m, int64_t j0, int64_t j1, ThreadCtx& t);

// dot_rows for the k-quants: x rounded to 8-bit blocks of 256 (qmatmul_kquant.h).
void kquant_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, int64_t j0, int64_t j1, ThreadCtx& t);
// dot_rows for any format: each row of W dequantized to f32, then multiplied
// with x in f32 (8 partial sums, a fixed tree).
void generic_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                  int64_t m, int64_t j0, int64_t j1, ThreadCtx& t);
// dequantize for any format (kiln::dequantize_row); c0, c1 multiples of its block.
void dequantize_any(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1,
                    float* dst, int64_t ldd);

inline const uint8_t* row_ptr(const QuantMatrix& W, int64_t j) {
  return static_cast<const uint8_t*>(W.data) + size_t(j) * W.row_stride;
}

}  // namespace kiln::cpu::qmatmul_detail
