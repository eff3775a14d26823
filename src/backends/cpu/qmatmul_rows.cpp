// The formats without kernels of their own in qmatmul_portable.cpp /
// qmatmul_avx512.cpp (those read Q8_0 and Q4_0): the k-quants' row-dot path on
// x rounded to BlockQ8K (qmatmul_kquant.h), and for the rest (Q4_1, Q5_0,
// Q5_1) a row-dot path that dequantizes one row of W at a time into f32 and
// multiplies it with x in f32 (exact up to f32 rounding); every format's tiles
// for the GEMM paths come from kiln::dequantize_row (bit-exact with ggml).
#include <algorithm>

#include "backends/cpu/qmatmul_internal.h"
#include "backends/cpu/qmatmul_kquant.h"

namespace kiln::cpu::qmatmul_detail {
namespace {

inline float tree8(const float* s) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

}  // namespace

void kquant_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, int64_t j0, int64_t j1, ThreadCtx& t) {
  const int64_t nb = W.cols / kQK;
  const KQuantDot dot = kquant_dot(W.format);
  auto* xq = static_cast<BlockQ8K*>(t.scratch(size_t(m * nb) * sizeof(BlockQ8K)));
  for (int64_t i = 0; i < m; ++i) quantize_q8k(x + i * ldx, xq + i * nb, nb);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = row_ptr(W, j);
    for (int64_t i = 0; i < m; ++i) y[i * ldy + j] = dot(row, xq + i * nb, nb);
  }
}

void generic_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                  int64_t m, int64_t j0, int64_t j1, ThreadCtx& t) {
  const int64_t K = W.cols;
  auto* w = static_cast<float*>(t.scratch(size_t(K) * sizeof(float)));
  for (int64_t j = j0; j < j1; ++j) {
    dequantize_row(W.format, row_ptr(W, j), w, K);
    for (int64_t i = 0; i < m; ++i) {
      const float* xi = x + i * ldx;
      float s[8] = {};
      for (int64_t c = 0; c < K; c += 8)  // K is whole blocks of 32
        for (int u = 0; u < 8; ++u) s[u] += w[c + u] * xi[c + u];
      y[i * ldy + j] = tree8(s);
    }
  }
}

void dequantize_any(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1,
                    float* dst, int64_t ldd) {
  const int64_t B = dtype_block_elems(W.format);
  const size_t bb = dtype_size(W.format);
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* src = row_ptr(W, j) + size_t(c0 / B) * bb;
    if (is_k_quant(W.format)) kquant_dequantize(W.format, src, (c1 - c0) / B, dst + (j - j0) * ldd);
    else dequantize_row(W.format, src, dst + (j - j0) * ldd, c1 - c0);
  }
}

}  // namespace kiln::cpu::qmatmul_detail
