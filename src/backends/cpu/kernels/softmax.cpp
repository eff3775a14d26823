// SOFTMAX and LOG_SOFTMAX: row-wise over the last axis of scale*x (+ mask), with
// the optional causal mask. Numerically stable (max subtracted first). Each row
// is computed by one thread in a fixed order, so results do not depend on the
// thread count. dst may alias src0 (in place): element c of x is read before
// element c of the row is written, and later passes only touch dst.
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/row_ops.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Thread t's items of [0, n), each costing about `cost` cheap operations; small
// jobs stay on fewer threads (common.h). Item values never depend on the split.
std::pair<int64_t, int64_t> items(const ThreadCtx& t, int64_t n, int64_t cost) {
  const Range r = thread_range(t, n, std::max<int64_t>(cost, 1), 1);
  return {r.begin, std::max(r.begin, r.end)};
}

using vm::VF;
constexpr int64_t kW = vm::kW;

void row_scale(float* y, int64_t n, float s) {
  const VF vs = vm::c<VF>(s);
  int64_t c = 0;
  for (; c + kW <= n; c += kW) vm::store(y + c, vm::loadv<VF>(y + c) * vs);
  for (; c < n; ++c) y[c] *= s;
}

// Turns y[0, n) = logits into (log-)probabilities; y[n, cols) are masked.
template <bool kLog>
void finish_row(float* y, int64_t n, int64_t cols) {
  const float fill = kLog ? kNegInf : 0.0f;
  const float mx = n > 0 ? row_max(y, n) : kNegInf;
  if (mx == kNegInf) {  // every entry masked: no distribution, avoid NaN
    // ...unless the row holds NaN, which the max skips: then the row is NaN (as
    // PyTorch), not a masked row (a NaN loss must not turn into a finite or -inf one).
    bool nan = false;
    for (int64_t c = 0; c < n; ++c) nan |= y[c] != y[c];
    const float v = nan ? std::numeric_limits<float>::quiet_NaN() : fill;
    for (int64_t c = 0; c < cols; ++c) y[c] = v;
    return;
  }
  if constexpr (kLog) {
    // (v - max) - log(sum) keeps the precision that v - (max + log(sum)) loses
    // when |max| is large.
    const float ls = vm::log(exp_sum(y, n, mx));
    for (int64_t c = 0; c < n; ++c) y[c] = (y[c] - mx) - ls;
  } else {
    row_scale(y, n, 1.0f / exp_store_sum(y, n, mx));
  }
  for (int64_t c = n; c < cols; ++c) y[c] = fill;
}

template <bool kLog>
void softmax_kernel(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const TensorNode* mask = dst->n_src > 1 ? dst->src[1] : nullptr;
  const int nd = x->shape.ndim();
  const int64_t cols = x->shape[nd - 1];
  if (cols == 0 || x->numel() == 0) return;
  const int64_t rows = x->numel() / cols;
  const int64_t nrows_causal = nd >= 2 ? x->shape[nd - 2] : 1;
  const SoftmaxParams prm = op_params<SoftmaxParams>(*dst);
  const float scale = prm.scale;
  const bool causal = prm.causal;
  const int64_t xs = x->stride[nd - 1];

  // The mask is right-aligned against x; size-1 dims broadcast (stride 0).
  int64_t mstride[kMaxDims] = {};  // mask byte stride per x dim
  int64_t ms_last = 0;
  if (mask) {
    const int mnd = mask->shape.ndim(), off = nd - mnd;
    for (int k = 0; k < mnd; ++k) mstride[k + off] = mask->shape[k] == 1 ? 0 : mask->stride[k];
    ms_last = mstride[nd - 1];
  }

  const auto [r0, r1] = items(t, rows, 8 * cols);
  int64_t idx[kMaxDims] = {};  // multi-index of row r0 over dims [0, nd-1)
  for (int64_t r = r0, d = nd - 2; d >= 0; --d) {
    idx[d] = r % x->shape[d];
    r /= x->shape[d];
  }
  float* out = static_cast<float*>(dst->data);
  for (int64_t r = r0; r < r1; ++r) {
    int64_t xoff = 0, moff = 0;
    for (int d = 0; d < nd - 1; ++d) {
      xoff += idx[d] * x->stride[d];
      moff += idx[d] * mstride[d];
    }
    float* y = out + r * cols;
    int64_t n = cols;
    if (causal) {
      const int64_t row = nd >= 2 ? idx[nd - 2] : 0;
      n = row + cols - nrows_causal + 1;
      n = n < 0 ? 0 : (n > cols ? cols : n);
    }
    const char* xr = static_cast<const char*>(x->data) + xoff;
    if (xs == int64_t(sizeof(float))) {
      const float* xp = reinterpret_cast<const float*>(xr);
      for (int64_t c = 0; c < n; ++c) y[c] = scale * xp[c];  // same index: alias-safe
    } else {
      for (int64_t c = 0; c < n; ++c) {
        float v;
        std::memcpy(&v, xr + c * xs, sizeof v);
        y[c] = scale * v;
      }
    }
    if (mask) {
      const char* mr = static_cast<const char*>(mask->data) + moff;
      if (ms_last == int64_t(sizeof(float))) {
        const float* mp = reinterpret_cast<const float*>(mr);
        for (int64_t c = 0; c < n; ++c) y[c] += mp[c];
      } else {
        for (int64_t c = 0; c < n; ++c) {
          float v;
          std::memcpy(&v, mr + c * ms_last, sizeof v);
          y[c] += v;
        }
      }
    }
    finish_row<kLog>(y, n, cols);
    for (int d = nd - 2; d >= 0; --d) {  // next row
      if (++idx[d] < x->shape[d]) break;
      idx[d] = 0;
    }
  }
}

}  // namespace

void kernel_SOFTMAX(TensorNode* dst, ThreadCtx& t) { softmax_kernel<false>(dst, t); }
void kernel_LOG_SOFTMAX(TensorNode* dst, ThreadCtx& t) { softmax_kernel<true>(dst, t); }

}  // namespace kiln::cpu
