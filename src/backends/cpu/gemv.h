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

// The same for a few rows of x (decoding several sequences together):
// y[m][i] for m < M <= 8, with A's rows read from memory once for all of
// them. The sums per row are gemv_rows's (the AVX-512 form calls its dot
// product; the portable one keeps its 8 partial sums and tree, but FMA
// contraction may differ: equal up to float rounding, not bit for bit).
// Any split of [i0, i1) gives the same bits.
void gemv_rows_multi(const GemmOperand& A, const float* const* x, int64_t M, int64_t K,
                     float* const* y, int64_t i0, int64_t i1, bool accumulate);

}  // namespace kiln::cpu
