// Matrix times vector, y[i] = dot(A row i, x), with A's rows contiguous (f32,
// f16 or bf16) and x contiguous f32: batch-1 decoding's x @ W^T, where every
// weight is read once and the speed is the memory bandwidth's. Rows are
// independent, so any split of [i0, i1) over threads gives the same bits.
#pragma once
#include <cstdint>

#include "backends/cpu/gemm.h"

namespace kiln::cpu {

// y[i] (= or +=, by accumulate) for rows i in [i0, i1); row i of A at
// A.data + i * A.rs elements, K elements each.
void gemv_rows(const GemmOperand& A, const float* x, int64_t K, float* y, int64_t i0, int64_t i1,
               bool accumulate);

}  // namespace kiln::cpu
