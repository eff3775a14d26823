// Row-wise SOFTMAX / LOG_SOFTMAX over the last axis (scale, optional broadcast
// additive mask, causal rule): one block per row, block_reduce for the row's
// max and sum in a fixed order, so results do not depend on timing.
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

struct RowGeom {
  int nd;
  int64_t shape[kMaxDims];
  int64_t xs[kMaxDims], ms[kMaxDims];  // byte strides of x and of the (broadcast) mask
};

template <bool kLog>
__global__ void k_softmax(const char* x, const char* mask, RowGeom g, int64_t cols,
                          int64_t nrows_causal, float scale, bool causal, float* out) {
  __shared__ float shm[33];
  __shared__ int shm_n[33];
  const int64_t r = blockIdx.x;
  int64_t rem = r, xoff = 0, moff = 0, row_in_mat = 0;
  for (int d = g.nd - 2; d >= 0; --d) {
    const int64_t i = rem % g.shape[d];
    rem /= g.shape[d];
    xoff += i * g.xs[d];
    moff += i * g.ms[d];
    if (d == g.nd - 2) row_in_mat = i;
  }
  int64_t n = cols;
  if (causal) n = min(cols, max(int64_t(0), row_in_mat + cols - nrows_causal + 1));
  const int64_t xs = g.xs[g.nd - 1], ms = g.ms[g.nd - 1];
  auto val = [&](int64_t c) {
    float v = scale * ldf(x, xoff + c * xs);
    if (mask) v += ldf(mask, moff + c * ms);
    return v;
  };
  float* y = out + r * cols;
  // The max of the non-NaN entries (as the CPU's row_max) and whether there is a NaN.
  float mx = -INFINITY;
  int nans = 0;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) {
    const float v = val(c);
    if (v != v) ++nans;
    else mx = v > mx ? v : mx;
  }
  mx = block_reduce(mx, -INFINITY, MaxNanOp{}, shm);
  nans = block_reduce(nans, 0, SumOp{}, shm_n);
  const float fill = kLog ? -INFINITY : 0.0f;
  if (mx == -INFINITY) {  // every entry masked: no distribution, avoid NaN...
    // ...unless the row holds NaN: then the whole row is NaN (as the CPU kernel),
    // so a NaN loss never turns into a finite or -inf one.
    const float v = nans ? NAN : fill;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[c] = v;
    return;
  }
  // With a NaN and a finite max, exp(NaN - mx) makes the sum, so every result, NaN.
  float s = 0.0f;
  for (int64_t c = threadIdx.x; c < n; c += blockDim.x) s += expf(val(c) - mx);
  s = block_reduce(s, 0.0f, SumOp{}, shm);
  // Every read of x is done (block_reduce synchronizes): in place is safe.
  if (kLog) {
    const float ls = logf(s);
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) y[c] = (val(c) - mx) - ls;
  } else {
    const float inv = 1.0f / s;
    for (int64_t c = threadIdx.x; c < n; c += blockDim.x) y[c] = expf(val(c) - mx) * inv;
  }
  for (int64_t c = n + threadIdx.x; c < cols; c += blockDim.x) y[c] = fill;
}

}  // namespace

void softmax_ops(TensorNode* dst, const Launch& L) {
  const TensorNode* x = dst->src[0];
  const TensorNode* mask = dst->n_src > 1 ? dst->src[1] : nullptr;
  const int nd = x->shape.ndim();
  if (nd == 0 || x->numel() == 0) return;
  const int64_t cols = x->shape[nd - 1];
  if (cols == 0) return;
  const int64_t rows = x->numel() / cols;
  RowGeom g{};
  g.nd = nd;
  for (int d = 0; d < nd; ++d) {
    g.shape[d] = x->shape[d];
    g.xs[d] = x->stride[size_t(d)];
  }
  if (mask) {  // right-aligned against x; size-1 dims broadcast
    const int mnd = mask->shape.ndim(), off = nd - mnd;
    for (int k = 0; k < mnd; ++k) g.ms[k + off] = mask->shape[k] == 1 ? 0 : mask->stride[size_t(k)];
  }
  const int threads = cols <= 32 ? 32 : cols <= 128 ? 128 : kThreads;
  const int64_t nrows_causal = nd >= 2 ? x->shape[nd - 2] : 1;
  const char* xp = static_cast<const char*>(x->data);
  const char* mp = mask ? static_cast<const char*>(mask->data) : nullptr;
  float* out = static_cast<float*>(dst->data);
  if (rows > INT32_MAX) fail("softmax", "too many rows for one CUDA launch: ", rows);
  if (dst->op == Op::SOFTMAX)
    k_softmax<false><<<unsigned(rows), threads, 0, L.stream>>>(
        xp, mp, g, cols, nrows_causal, prm::softmax_scale(dst), prm::softmax_causal(dst), out);
  else
    k_softmax<true><<<unsigned(rows), threads, 0, L.stream>>>(
        xp, mp, g, cols, nrows_causal, prm::softmax_scale(dst), prm::softmax_causal(dst), out);
  check_launch(op_name(dst->op));
}

OpKernel softmax_kernel(Op op) {
  switch (op) {
    case Op::SOFTMAX:
    case Op::LOG_SOFTMAX: return {all_f32, softmax_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
