// LAYER_NORM, LAYER_NORM_BACK and LAYER_NORM_BACK_AFFINE over the last axis.
// Each row's mean and 1/std are computed from x in the same fixed order by all
// three kernels (the backward ones recompute them: a row is in cache anyway, and
// the op table has one output per node). Rows go to threads whole, and the
// affine gradient sums fixed blocks of rows, so nothing depends on the thread count.
#include <cmath>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr int64_t kAffineRows = 64;  // rows per partial sum of the affine gradient

// Byte offset of row r (all dims but the last) of a tensor.
int64_t row_offset(const TensorNode* t, int64_t r) {
  int64_t off = 0;
  for (int d = t->shape.ndim() - 2; d >= 0; --d) {
    off += (r % t->shape[d]) * t->stride[d];
    r /= t->shape[d];
  }
  return off;
}

// Row r of t as contiguous floats (t itself, or converted into buf).
const float* row_of(const TensorNode* t, int64_t r, int64_t d, float* buf) {
  const char* p = static_cast<const char*>(t->data) + row_offset(t, r);
  return f32_row(p, t->dtype, t->stride[t->shape.ndim() - 1], d, buf);
}

struct RowStats {
  float mean, rstd;
};

// Two passes (mean, then the mean of squared deviations): no cancellation.
RowStats row_stats(const float* x, int64_t d, float eps) {
  const float mean = float(sum_f32(x, d) / double(d));
  const VF vm_ = vm::c<VF>(mean);
  VF acc = vm::c<VF>(0.0f);
  int64_t j = 0;
  for (; j + kW <= d; j += kW) {
    const VF c = vm::loadv<VF>(x + j) - vm_;
    acc = vm::madd(c, c, acc);
  }
  float var = vm::hsum(acc);
  for (; j < d; ++j) var += (x[j] - mean) * (x[j] - mean);
  var /= float(d);
  return {mean, 1.0f / std::sqrt(var + eps)};
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

// A [D] parameter as contiguous floats.
const float* vec_of(const TensorNode* t, int64_t d, float* buf) {
  return f32_row(static_cast<const char*>(t->data), t->dtype, t->stride[0], d, buf);
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
  float* buf = static_cast<float*>(t.scratch(size_t(3 * d) * sizeof(float)));
  const float* w = a.w ? vec_of(a.w, d, buf + d) : nullptr;
  const float* b = a.b ? vec_of(a.b, d, buf + 2 * d) : nullptr;
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* xr = row_of(x, i, d, buf);
    const RowStats s = row_stats(xr, d, p.eps);
    const VF vmean = vm::c<VF>(s.mean), vr = vm::c<VF>(s.rstd);
    float* y = out + i * d;
    for (int64_t j = 0; j < d; j += kW) {
      const int n = int(std::min(kW, d - j));
      VF v = (vm::loadv<VF>(xr + j, n) - vmean) * vr;
      if (w) v = v * vm::loadv<VF>(w + j, n);
      if (b) v = v + vm::loadv<VF>(b + j, n);
      vm::store(y + j, v, n);
    }
  }
}

// g = dy * w; dx = rstd * (g - mean(g) - xhat * mean(g * xhat)).
void kernel_LAYER_NORM_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const LayerNormParams p = op_params<Op::LAYER_NORM_BACK>(*dst);
  const TensorNode* wt = p.has_weight ? dst->src[2] : nullptr;
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / d;
  const Range r = thread_range(t, rows, 10 * d, 1);
  if (r.empty()) return;
  float* buf = static_cast<float*>(t.scratch(size_t(4 * d) * sizeof(float)));
  const float* w = wt ? vec_of(wt, d, buf + 2 * d) : nullptr;
  float* g = buf + 3 * d;
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* xr = row_of(x, i, d, buf);
    const float* dyr = row_of(dy, i, d, buf + d);
    const RowStats s = row_stats(xr, d, p.eps);
    const VF vmean = vm::c<VF>(s.mean), vr = vm::c<VF>(s.rstd);
    VF sg = vm::c<VF>(0.0f), sgx = sg;
    for (int64_t j = 0; j < d; j += kW) {
      const int n = int(std::min(kW, d - j));
      VF gv = vm::loadv<VF>(dyr + j, n);
      if (w) gv = gv * vm::loadv<VF>(w + j, n);
      vm::store(g + j, gv, n);
      const VF xh = (vm::loadv<VF>(xr + j, n) - vmean) * vr;  // masked lanes load 0
      sg = sg + gv;
      sgx = vm::madd(gv, xh, sgx);
    }
    const VF mg = vm::c<VF>(vm::hsum(sg) / float(d)), mgx = vm::c<VF>(vm::hsum(sgx) / float(d));
    float* o = out + i * d;
    for (int64_t j = 0; j < d; j += kW) {
      const int n = int(std::min(kW, d - j));
      const VF xh = (vm::loadv<VF>(xr + j, n) - vmean) * vr;
      vm::store(o + j, (vm::loadv<VF>(g + j, n) - mg - xh * mgx) * vr, n);
    }
  }
}

// dst [2, D]: row 0 = sum over rows of dy * xhat, row 1 = sum of dy. Blocks of
// kAffineRows rows give partial sums (shared scratch), added in block order.
void kernel_LAYER_NORM_BACK_AFFINE(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const LayerNormParams p = op_params<Op::LAYER_NORM_BACK_AFFINE>(*dst);
  const int64_t d = x->shape[x->shape.ndim() - 1];
  const int64_t rows = d == 0 ? 0 : x->numel() / d;
  const int64_t blocks = (rows + kAffineRows - 1) / kAffineRows;
  float* out = static_cast<float*>(dst->data);
  if (blocks == 0) {
    if (t.ith == 0) std::fill(out, out + 2 * d, 0.0f);
    return;
  }
  // Collective: every thread calls it (it holds barriers).
  float* part = static_cast<float*>(t.shared_scratch(size_t(blocks * 2 * d) * sizeof(float)));
  const int k = useful_threads(blocks, t.nth, kAffineRows * 6 * d);
  const Range br = t.ith < k ? split_range(blocks, t.ith, k) : Range{};
  float* buf = static_cast<float*>(t.scratch(size_t(2 * d) * sizeof(float)));
  for (int64_t blk = br.begin; blk < br.end; ++blk) {
    float* pw = part + blk * 2 * d;
    float* pb = pw + d;
    std::fill(pw, pw + 2 * d, 0.0f);
    const int64_t i1 = std::min(rows, (blk + 1) * kAffineRows);
    for (int64_t i = blk * kAffineRows; i < i1; ++i) {
      const float* xr = row_of(x, i, d, buf);
      const float* dyr = row_of(dy, i, d, buf + d);
      const RowStats s = row_stats(xr, d, p.eps);
      const VF vmean = vm::c<VF>(s.mean), vr = vm::c<VF>(s.rstd);
      for (int64_t j = 0; j < d; j += kW) {
        const int n = int(std::min(kW, d - j));
        const VF g = vm::loadv<VF>(dyr + j, n);
        const VF xh = (vm::loadv<VF>(xr + j, n) - vmean) * vr;
        vm::store(pw + j, vm::madd(g, xh, vm::loadv<VF>(pw + j, n)), n);
        vm::store(pb + j, vm::loadv<VF>(pb + j, n) + g, n);
      }
    }
  }
  t.barrier();
  const Range cr = split_range(2 * d, t.ith, t.nth, 16);
  for (int64_t c = cr.begin; c < cr.end; ++c) {
    const int64_t row = c / d, col = c % d;
    float acc = 0.0f;
    for (int64_t blk = 0; blk < blocks; ++blk) acc += part[blk * 2 * d + row * d + col];
    out[c] = acc;
  }
}

}  // namespace kiln::cpu
