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
#include "backends/cpu/qmatmul_kquant.h"
#include "kiln/error.h"

namespace kiln::cpu {
namespace {

using qmatmul_detail::has_isa_kernels;
using qmatmul_detail::kDotMaxRows;

// GEMM path tiles: rows of W per tile of x @ W^T; columns and rows of W per
// tile of dy @ W (for 32-value blocks; a tile of dy @ W is whole blocks wide,
// kXwTileCols * kXwTileRows values for any block).
constexpr int64_t kXwtTileRows = 64;
constexpr int64_t kXwTileCols = 64;
constexpr int64_t kXwTileRows = 1024;

// Rows j0..j1 of W and m rows of x, each y element computed the same way
// whatever the row range.
void dot_rows(const QuantMatrix& W, const float* x, int64_t ldx, float* y, int64_t ldy, int64_t m,
              int64_t j0, int64_t j1, ThreadCtx& t) {
  using qmatmul_detail::RowDot;
  switch (qmatmul_detail::row_dot(W.format)) {
    case RowDot::isa: return qmatmul_detail::dot_rows(W, x, ldx, y, ldy, m, j0, j1, t);
#if defined(KILN_QMATMUL_INT8_AVX2)
    case RowDot::int8_avx2: return qmatmul_detail::int8_avx2_rows(W, x, ldx, y, ldy, m, j0, j1, t);
#endif
    case RowDot::kquant: return qmatmul_detail::kquant_rows(W, x, ldx, y, ldy, m, j0, j1, t);
    default: return qmatmul_detail::generic_rows(W, x, ldx, y, ldy, m, j0, j1, t);
  }
}

// W[j0:j1, c0:c1] as f32 (exact: ggml's dequantization).
void dequantize(const QuantMatrix& W, int64_t j0, int64_t j1, int64_t c0, int64_t c1, float* dst,
                int64_t ldd) {
  if (has_isa_kernels(W.format)) qmatmul_detail::dequantize(W, j0, j1, c0, c1, dst, ldd);
  else qmatmul_detail::dequantize_any(W, j0, j1, c0, c1, dst, ldd);
}
// Rows of x (or dy) per tile of the GEMM path: with W's tiles, enough tiles to
// keep many threads busy when W is small.
constexpr int64_t kRowChunk = 256;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

void check(const char* op, const QuantMatrix& W, int64_t m, int64_t ld_in, int64_t in_cols,
           int64_t ld_out, int64_t out_cols) {
  if (W.rows < 0 || W.cols < 0 || m < 0)
    fail(op, "negative size: W is [", W.rows, ", ", W.cols, "], m = ", m);
  if (!is_quantized(W.format) || !quant_type(W.format).matmul_reads)
    fail(op, "W is ", dtype_name(W.format), ", which the CPU matmul does not read as stored");
  if (W.cols % dtype_block_elems(W.format) != 0)
    fail(op, "W has ", W.cols, " columns, not a multiple of ", dtype_name(W.format),
         "'s block size ", dtype_block_elems(W.format));
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

bool qmatmul_xwt_rounds_x(DType f, int64_t m) {
  using qmatmul_detail::RowDot;
  if (m < 1 || m > kDotMaxRows) return false;
  const RowDot k = qmatmul_detail::row_dot(f);
  if (k == RowDot::kquant || k == RowDot::int8_avx2) return true;
#if defined(KILN_QMATMUL_VNNI)
  return k == RowDot::isa;
#else
  return false;
#endif
}

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
      dot_rows(W, x, ldx, y, ldy, m, n * ith / nth, n * (ith + 1) / nth, t);
    } else {
      // Tiles (W row tile wt, x row chunk xc), numbered wt-major so that a
      // thread's consecutive tiles share the dequantized W tile.
      const int64_t wtiles = ceil_div(n, kXwtTileRows), xchunks = ceil_div(m, kRowChunk);
      const int64_t tiles = wtiles * xchunks;
      float* buf = static_cast<float*>(t.scratch(size_t(kXwtTileRows * K) * sizeof(float)));
      int64_t have = -1;  // the W tile in buf
      for (int64_t tile = tiles * ith / nth; tile < tiles * (ith + 1) / nth; ++tile) {
        const int64_t wt = tile / xchunks, xc = tile % xchunks;
        const int64_t j0 = wt * kXwtTileRows, j1 = std::min(n, j0 + kXwtTileRows);
        const int64_t i0 = xc * kRowChunk, i1 = std::min(m, i0 + kRowChunk);
        if (wt != have) dequantize(W, j0, j1, 0, K, buf, K), have = wt;
        // y[i0:i1, j0:j1] = x[i0:i1] @ tile^T (the tile is [j1-j0, K] row-major).
        gemm_alone({i1 - i0,
                    j1 - j0,
                    K,
                    {x + i0 * ldx, GemmType::f32, ldx, 1},
                    {buf, GemmType::f32, 1, K},
                    y + i0 * ldy + j0,
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
      // Tiles (W column tile ct, dy row chunk dc); each runs over all of W's
      // rows, kXwTileRows at a time, accumulating into dx.
      const int64_t tcols = std::max(kXwTileCols, dtype_block_elems(W.format));
      const int64_t trows = kXwTileRows * kXwTileCols / tcols;
      const int64_t ctiles = ceil_div(K, tcols), dchunks = ceil_div(m, kRowChunk);
      const int64_t tiles = ctiles * dchunks;
      const int64_t rows = std::min(n, trows);
      float* buf = static_cast<float*>(t.scratch(size_t(rows * tcols) * sizeof(float)));
      for (int64_t tile = tiles * ith / nth; tile < tiles * (ith + 1) / nth; ++tile) {
        const int64_t ct = tile / dchunks, dc = tile % dchunks;
        const int64_t c0 = ct * tcols, c1 = std::min(K, c0 + tcols);
        const int64_t i0 = dc * kRowChunk, i1 = std::min(m, i0 + kRowChunk);
        // dx[i0:i1, c0:c1] = sum over row blocks r of dy[i0:i1, r0:r1] @ W[r0:r1, c0:c1].
        for (int64_t r0 = 0; r0 < n; r0 += trows) {
          const int64_t r1 = std::min(n, r0 + trows);
          dequantize(W, r0, r1, c0, c1, buf, c1 - c0);
          gemm_alone({i1 - i0,
                      c1 - c0,
                      r1 - r0,
                      {dy + i0 * lddy + r0, GemmType::f32, lddy, 1},
                      {buf, GemmType::f32, c1 - c0, 1},
                      dx + i0 * lddx + c0,
                      lddx,
                      r0 > 0});
        }
      }
    }
  }
  t.barrier();  // all of dx is written when any thread returns
}

}  // namespace kiln::cpu
