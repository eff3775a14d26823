// Matrix products with the weight in GGUF's block-quantized formats (every
// row of kiln/quant_types.def), read as stored, never dequantized into a second
// copy: the forward of a Linear on a quantized base (x @ W^T) and its backward
// with respect to x (dy @ W), which is what LoRA on a quantized base needs. W's
// gradient is never computed: a quantized weight is frozen.
//
// Layout (bit-exact with ggml's): each row of W (K values, K a multiple of the
// format's block: 32, or 256 for the k-quants) is K / block blocks along the
// row. Q8_0: an f16 scale d, 32 int8, value = d * qs[i]. Q4_0: d, 16 bytes;
// byte i holds value i in its low nibble and value i + 16 in its high nibble,
// value = d * (nib - 8). The others: src/core/quant/<family>.cpp and
// qmatmul_kquant.cpp.
//
// Both functions are collective: every thread of a ThreadPool run calls them
// with its own ThreadCtx (a standalone ThreadCtx runs them on one thread); the
// work is split over t.nth threads and the result does not depend on t.nth.
// Each ends with a barrier: when it returns on any thread, all of the output
// is written. Bad shapes or strides throw kiln::Error.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"

namespace kiln::cpu {

// Q8_0 and Q4_0's block (the kernels of qmatmul_portable.cpp and
// qmatmul_avx512.cpp read those two; the other formats' code is in
// qmatmul_rows.cpp and qmatmul_kquant*.cpp).
inline constexpr int64_t kQuantBlock = dtype_block_elems(DType::q8_0);
static_assert(dtype_block_elems(DType::q4_0) == kQuantBlock, "q8_0 and q4_0 share a block size");

struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[kQuantBlock];
};
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[kQuantBlock / 2];
};
static_assert(sizeof(BlockQ8_0) == quant_type(DType::q8_0).block_bytes &&
                  sizeof(BlockQ4_0) == quant_type(DType::q4_0).block_bytes,
              "ggml block sizes");

// Bytes of one quantized row of k values (k whole blocks).
inline size_t quant_row_bytes(DType f, int64_t k) { return dtype_row_bytes(f, k); }

// A quantized matrix W [n, k]: row j starts at data + j * row_stride bytes.
struct QuantMatrix {
  const void* data = nullptr;
  DType format = DType::q8_0;  // a quantized type whose table row says qmatmul
  int64_t rows = 0, cols = 0;  // n, k
  size_t row_stride = 0;       // bytes, >= quant_row_bytes(format, cols)
};

// y[i, j] = sum_c x[i, c] * W[j, c] for i < m, j < W.rows (x @ W^T).
// x: m rows of W.cols f32, row stride ldx elements; y: row stride ldy elements.
void qmatmul_xwt(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, ThreadCtx& t);

// Whether qmatmul_xwt with m rows of x of format f rounds x to 8-bit blocks
// first: for m <= 4 (decoding), always for the k-quants (Q2_K..Q6_K: blocks of
// 256, qmatmul_kquant.h, integer products as ggml's Q8_K dots), and for Q8_0 /
// Q4_0 in builds with AVX512_VNNI (blocks of 32, vpdpbusd as llama.cpp). Each x
// value moves by at most half its block's step dx = max |x| over its block /
// 127 (0.39% of that max), so
//   |y - exact| <= sum_c |W[j, c]| * dx(c) / 2 + f32 rounding,
// dx(c) = max |x[i, block of c]| / 127. Otherwise (and always for qmatmul_xw)
// the product is the exact dequantized one up to f32 rounding. A non-finite x
// value makes the outputs that read it non-finite on every path (NaN on the
// rounding ones).
bool qmatmul_xwt_rounds_x(DType f, int64_t m);

// dx[i, c] = sum_j dy[i, j] * W[j, c] for i < m, c < W.cols (dy @ W).
// dy: m rows of W.rows f32, row stride lddy; dx: row stride lddx.
void qmatmul_xw(const QuantMatrix& W, const float* dy, int64_t lddy, float* dx, int64_t lddx,
                int64_t m, ThreadCtx& t);

}  // namespace kiln::cpu
