// qmatmul driver: validation, the split over threads, and the choice between
// the row-dot path (few rows of x: each quantized row read once, straight from
// storage) and the GEMM path (many rows: a fixed-size tile of W dequantized into
// the thread's scratch, multiplied by kiln's f32 GEMM). Tiles lie on a grid that
// depends on the shape only, and each tile is computed whole by one thread, so
// the result does not depend on the thread count.
#include "backends/cpu/qmatmul.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cpu/qmatmul_internal.h"
#include "kiln/error.h"

namespace kiln::cpu {
namespace {

using qmatmul_detail::dequantize;
using qmatmul_detail::dot_rows;

// x @ W^T with at most this many rows of x takes the row-dot path.
constexpr int64_t kDotMaxRows = 4;
// GEMM path tiles: rows of W per tile of x @ W^T; columns and rows of W per
// tile of dy @ W.
constexpr int64_t kXwtTileRows = 64;
constexpr int64_t kXwTileCols = 64;
constexpr int64_t kXwTileRows = 1024;

void check(const char* op, const QuantMatrix& W, int64_t m, int64_t ld_in, int64_t in_cols,
           int64_t ld_out, int64_t out_cols) {
  if (W.rows < 0 || W.cols < 0 || m < 0)
    fail(op, "negative size: W is [", W.rows, ", ", W.cols, "], m = ", m);
  if (W.cols % kQuantBlock != 0)
    fail(op, "W has ", W.cols, " columns, not a multiple of the block size ", kQuantBlock);
  if (W.format != QuantFormat::q8_0 && W.format != QuantFormat::q4_0)
    fail(op, "unknown quantization format ", int(W.format));
  if (W.rows > 0 && W.row_stride < quant_row_bytes(W.format, W.cols))
    fail(op, "W's row stride ", W.row_stride, " bytes is below its row size ",
         quant_row_bytes(W.format, W.cols));
  if (W.rows > 0 && W.cols > 0 && W.data == nullptr) fail(op, "W has no data");
  if (m > 1 && (ld_in < in_cols || ld_out < out_cols))
    fail(op, "row strides ", ld_in, " (input, ", in_cols, " columns) and ", ld_out, " (output, ",
         out_cols, " columns) are too short");
}

void zero_rows(float* y, int64_t ldy, int64_t m, int64_t cols, ThreadCtx& t) {
  for (int64_t i = m * t.ith / t.nth; i < m * (t.ith + 1) / t.nth; ++i)
    std::memset(y + i * ldy, 0, size_t(cols) * sizeof(float));
}

}  // namespace

void qmatmul_xwt(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy,
                 int64_t m, ThreadCtx& t) {
  check("qmatmul_xwt", W, m, ldx, W.cols, ldy, W.rows);
  const int64_t n = W.rows, K = W.cols;
  const int nth = std::max(1, t.nth), ith = t.ith;
  if (m > 0 && n > 0) {
    if (K == 0) {
      zero_rows(y, ldy, m, n, t);
    } else if (m <= kDotMaxRows) {
      // Every y element is computed the same way whatever the row range.
      dot_rows(W, x, ldx, y, ldy, m, n * ith / nth, n * (ith + 1) / nth);
    } else {
      const int64_t tiles = (n + kXwtTileRows - 1) / kXwtTileRows;
      float* buf = static_cast<float*>(t.scratch(size_t(kXwtTileRows * K) * sizeof(float)));
      for (int64_t tile = tiles * ith / nth; tile < tiles * (ith + 1) / nth; ++tile) {
        const int64_t j0 = tile * kXwtTileRows, j1 = std::min(n, j0 + kXwtTileRows);
        dequantize(W, j0, j1, 0, K, buf, K);
        // y[:, j0:j1] = x @ tile^T (the tile is [j1-j0, K] row-major).
        gemm_alone({m,
                    j1 - j0,
                    K,
                    {x, GemmType::f32, ldx, 1},
                    {buf, GemmType::f32, 1, K},
                    y + j0,
                    ldy,
                    false});
      }
    }
  }
  t.barrier();  // all of y is written when any thread returns
}

void qmatmul_xw(const QuantMatrix& W, const float* dy, int64_t lddy, float* dx, int64_t lddx,
                int64_t m, ThreadCtx& t) {
  check("qmatmul_xw", W, m, lddy, W.rows, lddx, W.cols);
  const int64_t n = W.rows, K = W.cols;
  const int nth = std::max(1, t.nth), ith = t.ith;
  if (m > 0 && K > 0) {
    if (n == 0) {
      zero_rows(dx, lddx, m, K, t);
    } else {
      const int64_t tiles = (K + kXwTileCols - 1) / kXwTileCols;
      const int64_t rows = std::min(n, kXwTileRows);
      float* buf = static_cast<float*>(t.scratch(size_t(rows * kXwTileCols) * sizeof(float)));
      for (int64_t tile = tiles * ith / nth; tile < tiles * (ith + 1) / nth; ++tile) {
        const int64_t c0 = tile * kXwTileCols, c1 = std::min(K, c0 + kXwTileCols);
        // dx[:, c0:c1] = sum over row blocks r of dy[:, r0:r1] @ W[r0:r1, c0:c1].
        for (int64_t r0 = 0; r0 < n; r0 += kXwTileRows) {
          const int64_t r1 = std::min(n, r0 + kXwTileRows);
          dequantize(W, r0, r1, c0, c1, buf, c1 - c0);
          gemm_alone({m,
                      c1 - c0,
                      r1 - r0,
                      {dy + r0, GemmType::f32, lddy, 1},
                      {buf, GemmType::f32, c1 - c0, 1},
                      dx + c0,
                      lddx,
                      r0 > 0});
        }
      }
    }
  }
  t.barrier();  // all of dx is written when any thread returns
}

}  // namespace kiln::cpu
