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

namespace kiln::cpu {

enum class QuantFormat : uint8_t { q8_0, q4_0 };

inline constexpr int64_t kQuantBlock = 32;

struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ8_0) == 34 && sizeof(BlockQ4_0) == 18, "ggml block sizes");

// Bytes of one quantized row of k values (k % 32 == 0).
inline size_t quant_row_bytes(QuantFormat f, int64_t k) {
  return size_t(k / kQuantBlock) * (f == QuantFormat::q8_0 ? sizeof(BlockQ8_0) : sizeof(BlockQ4_0));
}

// A quantized matrix W [n, k]: row j starts at data + j * row_stride bytes.
struct QuantMatrix {
  const void* data = nullptr;
  QuantFormat format = QuantFormat::q8_0;
  int64_t rows = 0, cols = 0;  // n, k
  size_t row_stride = 0;       // bytes, >= quant_row_bytes(format, cols)
};

// y[i, j] = sum_c x[i, c] * W[j, c] for i < m, j < W.rows (x @ W^T).
// x: m rows of W.cols f32, row stride ldx elements; y: row stride ldy elements.
void qmatmul_xwt(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, ThreadCtx& t);

// dx[i, c] = sum_j dy[i, j] * W[j, c] for i < m, c < W.cols (dy @ W).
// dy: m rows of W.rows f32, row stride lddy; dx: row stride lddx.
void qmatmul_xw(const QuantMatrix& W, const float* dy, int64_t lddy, float* dx, int64_t lddx,
                int64_t m, ThreadCtx& t);

}  // namespace kiln::cpu
