// Portable quantized kernels (plain C++; the compiler vectorizes the inner
// loops), for builds without AVX-512: the row-dot path dequantizes one block of a row at a time
// into f32 and multiplies it with x in f32, so results are the exact dequantized product up to f32
// rounding. Each row's sum runs in 8 partial sums (lane k % 8), reduced in a fixed tree.
#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/qmatmul_internal.h"

#if !defined(KILN_GEMM_AVX512)

namespace kiln::cpu::qmatmul_detail {
namespace {

using gemm_detail::f16_at;

// Block b of a row, as 32 f32 values.
inline void dequant_block(DType f, const uint8_t* row, int64_t b, float* out) {
  if (f == DType::q8_0) {
    const uint8_t* blk = row + b * int64_t(sizeof(BlockQ8_0));
    const float d = f16_at(blk);
    const int8_t* qs = reinterpret_cast<const int8_t*>(blk + 2);
    for (int l = 0; l < 32; ++l) out[l] = d * float(qs[l]);
  } else {
    const uint8_t* blk = row + b * int64_t(sizeof(BlockQ4_0));
    const float d = f16_at(blk);
    const uint8_t* qs = blk + 2;
    for (int l = 0; l < 16; ++l) {
      out[l] = d * float(int(qs[l] & 15) - 8);
      out[l + 16] = d * float(int(qs[l] >> 4) - 8);
    }
  }
}

inline float tree8(const float* s) {
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

// Up to R rows of x against row j of W.
template <int R>
void dot_group(DType f, const uint8_t* row, int64_t nb, const float* x, int64_t ldx, int r,
               float* y, int64_t ldy) {
  float s[R][8] = {};
  alignas(64) float w[32];
  for (int64_t b = 0; b < nb; ++b) {
    dequant_block(f, row, b, w);
    for (int i = 0; i < r; ++i) {
      const float* xb = x + i * ldx + b * 32;
      for (int l = 0; l < 32; l += 8)
        for (int u = 0; u < 8; ++u) s[i][u] += w[l + u] * xb[l + u];
    }
  }
  for (int i = 0; i < r; ++i) y[i * ldy] = tree8(s[i]);
}

}  // namespace

void dot_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
              int64_t j0, int64_t j1, ThreadCtx&) {
  const int64_t nb = W.cols / kQuantBlock;
  constexpr int R = 4;
  for (int64_t i = 0; i < m; i += R) {
    const int r = int(std::min<int64_t>(R, m - i));
    for (int64_t j = j0; j < j1; ++j)
      dot_group<R>(W.format, row_ptr(W, j), nb, x + i * ldx, ldx, r, y + i * ldy + j, ldy);
  }
}

void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd) {
  for (int64_t j = j0; j < j1; ++j) {
    const uint8_t* row = row_ptr(W, j);
    float* out = dst + (j - j0) * ldd;
    for (int64_t b = c0 / kQuantBlock; b < c1 / kQuantBlock; ++b, out += 32)
      dequant_block(W.format, row, b, out);
  }
}

}  // namespace kiln::cpu::qmatmul_detail

#endif  // !KILN_GEMM_AVX512
