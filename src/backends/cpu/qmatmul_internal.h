// Internals of kiln::cpu::qmatmul shared by the driver (qmatmul.cpp) and the
// instruction-set specific kernels (qmatmul_portable.cpp, qmatmul_avx512.cpp;
// exactly one of them defines each function, chosen at compile time like the
// GEMM micro-kernels).
#pragma once
#include <cstdint>

#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/qmatmul.h"

namespace kiln::cpu::qmatmul_detail {

// The row-dot path of x @ W^T (few rows of x): y[i*ldy + j] for i < m and rows
// j in [j0, j1) of W, each row of W read once for all m rows of x. Every y
// element is computed by the same operations whatever [j0, j1) is.
void dot_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
              int64_t j0, int64_t j1);

// W[j0:j1, c0:c1] as f32 into dst (row j - j0 at dst + (j - j0) * ldd); c0 and
// c1 multiples of 32. Exact: every quantized value is representable in f32.
void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd);

inline const uint8_t* row_ptr(const QuantMatrix& W, int64_t j) {
  return static_cast<const uint8_t*>(W.data) + size_t(j) * W.row_stride;
}

}  // namespace kiln::cpu::qmatmul_detail
