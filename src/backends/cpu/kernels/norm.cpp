// LAYER_NORM, LAYER_NORM_BACK and LAYER_NORM_BACK_AFFINE, and RMS_NORM,
// RMS_NORM_BACK and RMS_NORM_BACK_WEIGHT, over the last axis.
// Each row's statistics (mean and 1/std, or 1/rms) are computed from x in the
// same fixed order by a forward kernel and its backward ones (the backward ones
// recompute them: a row is in cache anyway, and the op table has one output per
// node). Rows go to threads whole, and the parameter gradients sum fixed blocks
// of rows, so nothing depends on the thread count. The layer norm kernels take
// a block of rows' statistics before their other passes (RowBlock), so the
// statistics' dependency chains of several rows overlap: kiln-gpt's [768, 128]
// rows run 1.3x (forward) to 1.4x (parameter gradients) faster than row by row.
#include <cmath>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr int64_t kAffineRows = 64;  // rows per partial sum of a parameter gradient

// Byte offset of row r (all dims but the last) of a tensor.
int64_t row_offset(const TensorNode* t, int64_t r) {
  int64_t off = 0;
  for (int d = t->shape.ndim() - 2; d >= 0; --d) {
    off += (r % t->shape[d]) * t->stride[d];
    r /= t->shape[d];
  }
  return off;
}

// Are t's rows contiguous f32 already (row_of returns pointers into t)?
bool f32_rows_direct(const TensorNode* t, int64_t d) {
  return t->dtype == DType::f32 && (d <= 1 || t->stride[t->shape.ndim() - 1] == 4);
}

// Row r of t as contiguous floats (t itself, or converted into buf).
const float* row_of(const TensorNode* t, int64_t r, int64_t d, float* buf) {
  const char* p = static_cast<const char*>(t->data) + row_offset(t, r);
  return f32_row(p, t->dtype, t->stride[t->shape.ndim() - 1], d, buf);
}

struct RowStats {
  float mean, rstd;
};

// Two passes (mean, then the mean of squared deviations): no cancellation. Two
// accumulators halve the dependency chain of the second pass (rows are short).
RowStats row_stats(const float* x, int64_t d, float eps) {
  const float mean = float(sum_f32(x, d) / double(d));
  const VF vm_ = vm::c<VF>(mean);
  VF a0 = vm::c<VF>(0.0f), a1 = a0;
  int64_t j = 0;
  for (; j + 2 * kW <= d; j += 2 * kW) {
    const VF c0 = vm::loadv<VF>(x + j) - vm_, c1 = vm::loadv<VF>(x + j + kW) - vm_;
    a0 = vm::madd(c0, c0, a0);
    a1 = vm::madd(c1, c1, a1);
  }
  for (; j + kW <= d; j += kW) {
    const VF c = vm::loadv<VF>(x + j) - vm_;
    a0 = vm::madd(c, c, a0);
  }
  float var = vm::hsum(a0 + a1);
  for (; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
  var /= float(d);
  return {mean, 1.0f / std::sqrt(var + eps)};
}

// Rows are handled in blocks of up to kStatRows: a block's statistics first, then
// its passes. Each row's statistics are a long dependency chain (two sums, two
// horizontal adds, a square root and divisions) of few instructions, so a loop of
// only those lets the chains of several rows overlap.
constexpr int64_t kStatRows = 16;
struct RowBlock {
  const float* row[kStatRows];  // contiguous f32 rows (into t, or converted)
  RowStats st[kStatRows];
};
// Floats of conversion space rows_of needs for t's rows (0 when they are f32 already).
int64_t conv_floats(const TensorNode* t, int64_t d) {
  return f32_rows_direct(t, d) ? 0 : kStatRows * d;
}
// Rows i0 .. i0 + nr - 1 (nr <= kStatRows) of t; conv: conv_floats(t, d) floats.
void rows_of(const TensorNode* t, int64_t i0, int64_t nr, int64_t d, float* conv,
             const float** row) {
  for (int64_t r = 0; r < nr; ++r) row[r] = row_of(t, i0 + r, d, conv ? conv + r * d : nullptr);
}
void block_stats(RowBlock& b, int64_t nr, int64_t d, float eps) {
  for (int64_t r = 0; r < nr; ++r) b.st[r] = row_stats(b.row[r], d, eps);
}

struct Affine {
  const TensorNode* w = nullptr;
  const TensorNode* b = nullptr;
};
Affine affine_of(const TensorNode* n, const LayerNormParams& p, int first) {
  Affine a;
  int i = first;
  if (p.has_weight) a.w = n->src[i++];
  if (p.has_bias) a.b = n->src[i++];
  return a;
}

// The gradient a backward kernel adds to its dx (has_residual, at source index
// i; Graph::fuse_norm_residual folded their ADD into it), or null.
const TensorNode* residual_of(const TensorNode* dst, bool has, int i) {
  return has ? dst->src[i] : nullptr;
}

// A [D] parameter as contiguous floats.
const float* vec_of(const TensorNode* t, int64_t d, float* buf) {
  return f32_row(static_cast<const char*>(t->data), t->dtype, t->stride[0], d, buf);
}

// 1 / sqrt(mean(x^2) + eps) of a row: two vector accumulators, then their sum.
float row_rstd(const float* x, int64_t d, float eps) {
  VF a0 = vm::c<VF>(0.0f), a1 = a0;
  int64_t j = 0;
  for (; j + 2 * kW <= d; j += 2 * kW) {
    const VF v0 = vm::loadv<VF>(x + j), v1 = vm::loadv<VF>(x + j + kW);
    a0 = vm::madd(v0, v0, a0);
    a1 = vm::madd(v1, v1, a1);
  }
  for (; j < d; j += kW) {
    const VF v = vm::loadv<VF>(x + j, int(std::min(kW, d - j)));  // masked lanes load 0
    a0 = vm::madd(v, v, a0);
  }
  return 1.0f / std::sqrt(vm::hsum(a0 + a1) / float(d) + eps);
}

// Partial sums of a parameter gradient: rows in blocks of kAffineRows, block b's
// `width` sums at part + b * width; blocks are spread over the threads and later
// added in block order (nothing depends on the thread count).
struct RowBlocks {
  int64_t rows, blocks;
  Range mine;
};
RowBlocks row_blocks(const ThreadCtx& t, int64_t rows, int64_t row_cost) {
  RowBlocks b{rows, (rows + kAffineRows - 1) / kAffineRows, {}};
  const int k = useful_threads(b.blocks, t.nth, kAffineRows * row_cost);
  if (t.ith < k) b.mine = split_range(b.blocks, t.ith, k);
  return b;
}
// out[c] = sum over blocks of part[b * width + c], c in [0, width), split over threads.
void sum_blocks(const float* part, int64_t blocks, int64_t width, float* out, ThreadCtx& t) {
  const Range cr = split_range(width, t.ith, t.nth, 16);
  for (int64_t c = cr.begin; c < cr.end; ++c) {
    float acc = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) acc += part[blk * width + c];
    out[c] = acc;
  }
}

}  // namespace

void kernel_LAYER_NORM(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const LayerNormParams p = op_params<Op::LAYER_NORM>(*dst);
  const Affine a = affine_of(dst, p, 1);
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / d;
  const Range r = thread_range(t, rows, 6 * d, 1);
  if (r.empty()) return;
  const int64_t cx = conv_floats(x, d);
  // A bf16 dst (a cast fused into the norm, Graph::fuse_bf16_casts): each row is
  // computed in f32 into a scratch row, then rounded as a COPY to bf16 would.
  const bool to_bf16 = dst->dtype == DType::bf16;
  float* buf = static_cast<float*>(t.scratch(size_t(cx + (to_bf16 ? 3 : 2) * d) * sizeof(float)));
  const float* w = a.w ? vec_of(a.w, d, buf + cx) : nullptr;
  const float* b = a.b ? vec_of(a.b, d, buf + cx + d) : nullptr;
  float* out = static_cast<float*>(dst->data);
  float* row_f32 = buf + cx + 2 * d;
  RowBlock blk;
  for (int64_t i0 = r.begin; i0 < r.end; i0 += kStatRows) {
    const int64_t nr = std::min(kStatRows, r.end - i0);
    rows_of(x, i0, nr, d, cx ? buf : nullptr, blk.row);
    block_stats(blk, nr, d, p.eps);
    for (int64_t k = 0; k < nr; ++k) {
      const float* xr = blk.row[k];
      const VF vmean = vm::c<VF>(blk.st[k].mean), vr = vm::c<VF>(blk.st[k].rstd);
      float* y = to_bf16 ? row_f32 : out + (i0 + k) * d;
      for (int64_t j = 0; j < d; j += kW) {
        const int n = int(std::min(kW, d - j));
        const VF xh = (vm::loadv<VF>(xr + j, n) - vmean) * vr;
        VF v;
        if (w && b) v = vm::madd(xh, vm::loadv<VF>(w + j, n), vm::loadv<VF>(b + j, n));
        else if (w) v = xh * vm::loadv<VF>(w + j, n);
        else if (b) v = xh + vm::loadv<VF>(b + j, n);
        else v = xh;
        vm::store(y + j, v, n);
      }
      if (to_bf16) f32_to_bf16_n(y, static_cast<uint16_t*>(dst->data) + (i0 + k) * d, d);
    }
  }
}

// g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat)), xhat = xc * rstd,
// xc = x - mean: with S = sum(g * xc) that is rstd * g - rstd * mean(g) - xc * B,
// B = rstd^3 S / d, so the second pass is g, xc and two fused multiply-adds per
// element (g recomputed from dy rather than stored and reloaded).
void kernel_LAYER_NORM_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const LayerNormParams p = op_params<Op::LAYER_NORM_BACK>(*dst);
  const TensorNode* wt = p.has_weight ? dst->src[2] : nullptr;
  const TensorNode* res = residual_of(dst, p.has_residual, 2 + int(p.has_weight));
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / d;
  const Range r = thread_range(t, rows, 10 * d, 1);
  if (r.empty()) return;
  const int64_t cx = conv_floats(x, d), cdy = conv_floats(dy, d);
  const int64_t cres = res ? conv_floats(res, d) : 0;
  float* buf = static_cast<float*>(t.scratch(size_t(cx + cdy + cres + d) * sizeof(float)));
  const float* w = wt ? vec_of(wt, d, buf + cx + cdy + cres) : nullptr;
  float* out = static_cast<float*>(dst->data);
  const float* resrows[kStatRows];
  auto grad_out = [w](const float* dyr, int64_t j, int n) {
    const VF g = vm::loadv<VF>(dyr + j, n);
    return w ? g * vm::loadv<VF>(w + j, n) : g;
  };
  RowBlock blk;
  const float* dyrows[kStatRows];
  float coef[kStatRows][2];  // per row: -B and -rstd * mean(g)
  for (int64_t i0 = r.begin; i0 < r.end; i0 += kStatRows) {
    const int64_t nr = std::min(kStatRows, r.end - i0);
    rows_of(x, i0, nr, d, cx ? buf : nullptr, blk.row);
    rows_of(dy, i0, nr, d, cdy ? buf + cx : nullptr, dyrows);
    if (res) rows_of(res, i0, nr, d, cres ? buf + cx + cdy : nullptr, resrows);
    block_stats(blk, nr, d, p.eps);
    for (int64_t k = 0; k < nr; ++k) {
      const float *xr = blk.row[k], *dyr = dyrows[k];
      const RowStats s = blk.st[k];
      const VF vmean = vm::c<VF>(s.mean);
      // Two accumulators per sum (even and odd vectors): shorter dependency chains.
      VF sg[2] = {vm::c<VF>(0.0f), vm::c<VF>(0.0f)}, sgc[2] = {sg[0], sg[0]};
      for (int64_t j = 0, e = 0; j < d; j += kW, e ^= 1) {
        const int n = int(std::min(kW, d - j));
        const VF g = grad_out(dyr, j, n);  // masked lanes load 0
        const VF xc = vm::loadv<VF>(xr + j, n) - vmean;
        sg[e] = sg[e] + g;
        sgc[e] = vm::madd(g, xc, sgc[e]);
      }
      const float mg = vm::hsum(sg[0] + sg[1]) / float(d);
      coef[k][0] = -(s.rstd * s.rstd * s.rstd * (vm::hsum(sgc[0] + sgc[1]) / float(d)));
      coef[k][1] = -s.rstd * mg;
    }
    for (int64_t k = 0; k < nr; ++k) {
      const float *xr = blk.row[k], *dyr = dyrows[k];
      const VF vmean = vm::c<VF>(blk.st[k].mean), va = vm::c<VF>(blk.st[k].rstd);
      const VF vnb = vm::c<VF>(coef[k][0]), vc = vm::c<VF>(coef[k][1]);
      float* o = out + (i0 + k) * d;
      for (int64_t j = 0; j < d; j += kW) {
        const int n = int(std::min(kW, d - j));
        const VF xc = vm::loadv<VF>(xr + j, n) - vmean;
        const VF dx = vm::madd(grad_out(dyr, j, n), va, vm::madd(xc, vnb, vc));
        vm::store(o + j, res ? vm::loadv<VF>(resrows[k] + j, n) + dx : dx, n);
      }
    }
  }
}

// dst [2, D]: row 0 = sum over rows of dy * xhat, row 1 = sum of dy. Blocks of
// kAffineRows rows give partial sums (shared scratch), added in block order.
// Within a block the rows' statistics come first; then each strip of kStrip
// vectors of columns is summed over the block's rows in registers (row by row,
// the same order as one running sum per column).
void kernel_LAYER_NORM_BACK_AFFINE(TensorNode* dst, ThreadCtx& t) {
  constexpr int kStrip = 4;
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const LayerNormParams p = op_params<Op::LAYER_NORM_BACK_AFFINE>(*dst);
  const int64_t d = x->shape[x->shape.ndim() - 1];
  float* out = static_cast<float*>(dst->data);
  const RowBlocks rb = row_blocks(t, d == 0 ? 0 : x->numel() / d, 6 * d);
  if (rb.blocks == 0) {
    if (t.ith == 0) std::fill(out, out + 2 * d, 0.0f);
    return;
  }
  // Collective: every thread calls it (it holds barriers).
  float* part = static_cast<float*>(t.shared_scratch(size_t(rb.blocks * 2 * d) * sizeof(float)));
  // Per thread: a block's rows of x and dy as contiguous f32 (pointers to the
  // tensors themselves when they already are), and the rows' statistics.
  const bool conv_x = !f32_rows_direct(x, d), conv_dy = !f32_rows_direct(dy, d);
  const size_t row_floats = size_t(kAffineRows * d);
  char* mem = static_cast<char*>(
      t.scratch((row_floats * (int(conv_x) + int(conv_dy)) + 2 * kAffineRows) * sizeof(float) +
                2 * kAffineRows * sizeof(const float*)));
  float* xbuf = reinterpret_cast<float*>(mem);
  float* dybuf = xbuf + (conv_x ? row_floats : 0);
  float* mean = dybuf + (conv_dy ? row_floats : 0);
  float* rstd = mean + kAffineRows;
  const float** xr = reinterpret_cast<const float**>(rstd + kAffineRows);
  const float** dyr = xr + kAffineRows;
  for (int64_t blk = rb.mine.begin; blk < rb.mine.end; ++blk) {
    const int64_t i0 = blk * kAffineRows, nr = std::min(rb.rows, i0 + kAffineRows) - i0;
    for (int64_t r = 0; r < nr; ++r) {
      xr[r] = row_of(x, i0 + r, d, conv_x ? xbuf + r * d : nullptr);
      dyr[r] = row_of(dy, i0 + r, d, conv_dy ? dybuf + r * d : nullptr);
      const RowStats s = row_stats(xr[r], d, p.eps);
      mean[r] = s.mean;
      rstd[r] = s.rstd;
    }
    float* pw = part + blk * 2 * d;
    float* pb = pw + d;
    for (int64_t j0 = 0; j0 < d; j0 += kStrip * kW) {
      VF aw[kStrip], ab[kStrip];
      for (int k = 0; k < kStrip; ++k) aw[k] = ab[k] = vm::c<VF>(0.0f);
      for (int64_t r = 0; r < nr; ++r) {
        const VF vmean = vm::c<VF>(mean[r]), vr = vm::c<VF>(rstd[r]);
        for (int k = 0; k < kStrip; ++k) {
          const int64_t j = j0 + k * kW;
          if (j >= d) break;
          const int n = int(std::min(kW, d - j));
          const VF g = vm::loadv<VF>(dyr[r] + j, n);
          const VF xh = (vm::loadv<VF>(xr[r] + j, n) - vmean) * vr;
          aw[k] = vm::madd(g, xh, aw[k]);
          ab[k] = ab[k] + g;
        }
      }
      for (int k = 0; k < kStrip; ++k) {
        const int64_t j = j0 + k * kW;
        if (j >= d) break;
        const int n = int(std::min(kW, d - j));
        vm::store(pw + j, aw[k], n);
        vm::store(pb + j, ab[k], n);
      }
    }
  }
  t.barrier();
  sum_blocks(part, rb.blocks, 2 * d, out, t);
}

// y = x * rstd * w. In place is safe: a row is read whole (rstd) before any of
// it is written, and each element is read before it is overwritten.
void kernel_RMS_NORM(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const RmsNormParams p = op_params<Op::RMS_NORM>(*dst);
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / d;
  const Range r = thread_range(t, rows, 3 * d, 1);
  if (r.empty()) return;
  float* buf = static_cast<float*>(t.scratch(size_t(2 * d) * sizeof(float)));
  const float* w = p.has_weight ? vec_of(dst->src[1], d, buf + d) : nullptr;
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* xr = row_of(x, i, d, buf);
    const VF vr = vm::c<VF>(row_rstd(xr, d, p.eps));
    float* y = out + i * d;
    int64_t j = 0;
    if (w) {
      for (; j + kW <= d; j += kW)
        vm::store(y + j, vm::loadv<VF>(xr + j) * vr * vm::loadv<VF>(w + j));
    } else {
      for (; j + kW <= d; j += kW) vm::store(y + j, vm::loadv<VF>(xr + j) * vr);
    }
    if (j < d) {
      const int n = int(d - j);
      VF v = vm::loadv<VF>(xr + j, n) * vr;
      if (w) v = v * vm::loadv<VF>(w + j, n);
      vm::store(y + j, v, n);
    }
  }
}

// g = dy * w; dx = rstd * (g - xhat * mean(g * xhat)) = rstd * g - x * (rstd^3 mean(g x)).
void kernel_RMS_NORM_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const RmsNormParams p = op_params<Op::RMS_NORM_BACK>(*dst);
  const TensorNode* res = residual_of(dst, p.has_residual, 2 + int(p.has_weight));
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / d;
  const Range r = thread_range(t, rows, 6 * d, 1);
  if (r.empty()) return;
  float* buf = static_cast<float*>(t.scratch(size_t(4 * d) * sizeof(float)));
  const float* w = p.has_weight ? vec_of(dst->src[2], d, buf + 2 * d) : nullptr;
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* xr = row_of(x, i, d, buf);
    const float* dyr = row_of(dy, i, d, buf + d);
    const float* resr = res ? row_of(res, i, d, buf + 3 * d) : nullptr;
    const float rs = row_rstd(xr, d, p.eps);
    VF sgx = vm::c<VF>(0.0f);
    for (int64_t j = 0; j < d; j += kW) {
      const int n = int(std::min(kW, d - j));
      VF g = vm::loadv<VF>(dyr + j, n);
      if (w) g = g * vm::loadv<VF>(w + j, n);
      sgx = vm::madd(g, vm::loadv<VF>(xr + j, n), sgx);  // masked lanes load 0
    }
    const VF vr = vm::c<VF>(rs), k = vm::c<VF>(rs * rs * rs * vm::hsum(sgx) / float(d));
    float* o = out + i * d;
    for (int64_t j = 0; j < d; j += kW) {
      const int n = int(std::min(kW, d - j));
      VF g = vm::loadv<VF>(dyr + j, n);
      if (w) g = g * vm::loadv<VF>(w + j, n);
      const VF dx = g * vr - vm::loadv<VF>(xr + j, n) * k;
      vm::store(o + j, resr ? vm::loadv<VF>(resr + j, n) + dx : dx, n);
    }
  }
}

// dst [D] = sum over rows of dy * x * rstd, by blocks of rows (row_blocks).
void kernel_RMS_NORM_BACK_WEIGHT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const RmsNormParams p = op_params<Op::RMS_NORM_BACK_WEIGHT>(*dst);
  const int64_t d = x->shape[x->shape.ndim() - 1];
  float* out = static_cast<float*>(dst->data);
  const RowBlocks rb = row_blocks(t, d == 0 ? 0 : x->numel() / d, 4 * d);
  if (rb.blocks == 0) {
    if (t.ith == 0) std::fill(out, out + d, 0.0f);
    return;
  }
  // Collective: every thread calls it (it holds barriers).
  float* part = static_cast<float*>(t.shared_scratch(size_t(rb.blocks * d) * sizeof(float)));
  float* buf = static_cast<float*>(t.scratch(size_t(2 * d) * sizeof(float)));
  for (int64_t blk = rb.mine.begin; blk < rb.mine.end; ++blk) {
    float* pw = part + blk * d;
    std::fill(pw, pw + d, 0.0f);
    const int64_t i1 = std::min(rb.rows, (blk + 1) * kAffineRows);
    for (int64_t i = blk * kAffineRows; i < i1; ++i) {
      const float* xr = row_of(x, i, d, buf);
      const float* dyr = row_of(dy, i, d, buf + d);
      const VF vr = vm::c<VF>(row_rstd(xr, d, p.eps));
      for (int64_t j = 0; j < d; j += kW) {
        const int n = int(std::min(kW, d - j));
        const VF gx = vm::loadv<VF>(dyr + j, n) * vm::loadv<VF>(xr + j, n);
        vm::store(pw + j, vm::madd(gx, vr, vm::loadv<VF>(pw + j, n)), n);
      }
    }
  }
  t.barrier();
  sum_blocks(part, rb.blocks, d, out, t);
}

}  // namespace kiln::cpu
