// Matrix products with the weight in GGUF's block-quantized formats (Q8_0,
// Q4_0), read as stored, never dequantized into a second copy: the forward of a
// Linear on a quantized base (x @ W^T) and its backward with respect to x
// (dy @ W), which is what LoRA on a quantized base needs. W's gradient is never
// computed: a quantized weight is frozen.
//
// Layout (bit-exact with ggml's): each row of W (K values, K % 32 == 0) is K/32
// blocks of 32 values along the row; a block is an f16 scale d followed by the
// quants. Q8_0: value = d * qs[i] (int8). Q4_0: 16 bytes; byte i holds value i
// in its low nibble and value i + 16 in its high nibble, value = d * (nib - 8).
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

// The types these kernels read as stored: the rows of kiln/quant_types.def
// whose matmul column is qmatmul (q8_0, q4_0). Both have 32-value blocks.
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

// The kernels dispatch on q8_0, and take any other format for q4_0: a new
// qmatmul row in the table needs its own kernels (and dispatch) first.
constexpr bool reads_only_q8_0_and_q4_0() {
  for (const QuantType& q : kQuantTypes)
    if (q.matmul_reads && q.dtype != DType::q8_0 && q.dtype != DType::q4_0) return false;
  return true;
}
static_assert(reads_only_q8_0_and_q4_0(), "quant_types.def: a qmatmul row without kernels here");

// Bytes of one quantized row of k values (k % 32 == 0).
inline size_t quant_row_bytes(DType f, int64_t k) { return dtype_row_bytes(f, k); }

// A quantized matrix W [n, k]: row j starts at data + j * row_stride bytes.
struct QuantMatrix {
  const void* data = nullptr;
  DType format = DType::q8_0;  // q8_0 or q4_0
  int64_t rows = 0, cols = 0;  // n, k
  size_t row_stride = 0;       // bytes, >= quant_row_bytes(format, cols)
};

// y[i, j] = sum_c x[i, c] * W[j, c] for i < m, j < W.rows (x @ W^T).
// x: m rows of W.cols f32, row stride ldx elements; y: row stride ldy elements.
void qmatmul_xwt(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, ThreadCtx& t);

// Whether qmatmul_xwt with m rows of x rounds x to int8 first: true for m <= 4
// (decoding) in builds with AVX512_VNNI, which then multiply int8 blocks as
// llama.cpp does. Each x value moves by at most half its block's step
// dx = max |x| over its block of 32 / 127 (0.39% of that max), so
//   |y - exact| <= sum_c |W[j, c]| * dx(c) / 2 + f32 rounding,
// dx(c) = max |x[i, block of c]| / 127. Otherwise (and always for qmatmul_xw)
// the product is the exact dequantized one up to f32 rounding. A non-finite x
// value makes the outputs that read it non-finite on every path (NaN on the
// int8 one).
bool qmatmul_xwt_rounds_x(int64_t m);

// dx[i, c] = sum_j dy[i, j] * W[j, c] for i < m, c < W.cols (dy @ W).
// dy: m rows of W.rows f32, row stride lddy; dx: row stride lddx.
void qmatmul_xw(const QuantMatrix& W, const float* dy, int64_t lddy, float* dx, int64_t lddx,
                int64_t m, ThreadCtx& t);

}  // namespace kiln::cpu
