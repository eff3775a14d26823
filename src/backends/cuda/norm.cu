// RMS_NORM, RMS_NORM_BACK and RMS_NORM_BACK_WEIGHT over the last axis. The
// forward and dx kernels take one block per row, with block_reduce for the row's
// sums (a fixed order: results do not depend on timing); the weight gradient
// first writes each row's 1/rms to the workspace, then one thread per column
// sums its rows in order. LAYER_NORM and its backward ops have no CUDA kernels
// yet (the scheduler runs them on the CPU).
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// Where row r (all dims but the last) of a tensor starts, and its element step.
struct Rows {
  int nd;
  int64_t shape[kMaxDims];
  int64_t stride[kMaxDims];  // bytes
  __device__ int64_t off(int64_t r) const {
    int64_t o = 0;
    for (int d = nd - 2; d >= 0; --d) {
      o += (r % shape[d]) * stride[d];
      r /= shape[d];
    }
    return o;
  }
  __device__ int64_t step() const { return stride[nd - 1]; }
};

Rows rows_of(const TensorNode* t) {
  Rows r{};
  r.nd = t->shape.ndim();
  for (int d = 0; d < r.nd; ++d) {
    r.shape[d] = t->shape[d];
    r.stride[d] = t->stride[size_t(d)];
  }
  return r;
}

// 1/sqrt(mean(x^2) + eps) of row r; every thread of the block gets it.
__device__ float row_rstd(const char* x, const Rows& g, int64_t r, int64_t d, float eps,
                          float* shm) {
  const int64_t xo = g.off(r), xs = g.step();
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float v = ldf(x, xo + j * xs);
    s += v * v;
  }
  s = block_reduce(s, 0.0f, SumOp{}, shm);
  return 1.0f / sqrtf(s / float(d) + eps);  // as the CPU kernel, not the approximate rsqrtf
}

__global__ void k_rms_norm(const char* x, Rows g, const char* w, int64_t ws, int64_t d, float eps,
                           float* out) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x;
  const float rs = row_rstd(x, g, r, d, eps, shm);
  const int64_t xo = g.off(r), xs = g.step();
  // Every read of x is done (block_reduce synchronizes): in place is safe.
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float v = ldf(x, xo + j * xs) * rs;
    if (w) v *= ldf(w, j * ws);
    out[r * d + j] = v;
  }
}

// dx = rstd * g - x * rstd^3 * mean(g x), g = dy * w; plus row r of res when
// there is one (has_residual, Graph::fuse_norm_residual).
__global__ void k_rms_norm_back(const char* dy, Rows gd, const char* x, Rows gx, const char* w,
                                int64_t ws, const char* res, Rows gr, int64_t d, float eps,
                                float* out) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x;
  const float rs = row_rstd(x, gx, r, d, eps, shm);
  const int64_t xo = gx.off(r), xs = gx.step(), go = gd.off(r), gs = gd.step();
  float sgx = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(dy, go + j * gs);
    if (w) g *= ldf(w, j * ws);
    sgx += g * ldf(x, xo + j * xs);
  }
  sgx = block_reduce(sgx, 0.0f, SumOp{}, shm);
  const float k = rs * rs * rs * sgx / float(d);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(dy, go + j * gs);
    if (w) g *= ldf(w, j * ws);
    const float dx = g * rs - ldf(x, xo + j * xs) * k;
    out[r * d + j] = res ? ldf(res, gr.off(r) + j * gr.step()) + dx : dx;
  }
}

__global__ void k_row_rstd(const char* x, Rows g, int64_t d, float eps, float* rstd) {
  __shared__ float shm[33];
  const float rs = row_rstd(x, g, blockIdx.x, d, eps, shm);
  if (threadIdx.x == 0) rstd[blockIdx.x] = rs;
}

// out[c] = sum over rows r (in order) of dy[r, c] * x[r, c] * rstd[r].
__global__ void k_rms_norm_back_weight(const char* dy, Rows gd, const char* x, Rows gx,
                                       const float* rstd, int64_t rows, int64_t d, float* out) {
  KILN_GRID_LOOP(c, d) {
    float acc = 0.0f;
    for (int64_t r = 0; r < rows; ++r)
      acc += ldf(dy, gd.off(r) + c * gd.step()) * ldf(x, gx.off(r) + c * gx.step()) * rstd[r];
    out[c] = acc;
  }
}

int threads_for(int64_t d) { return d <= 32 ? 32 : d <= 128 ? 128 : kThreads; }

void rms_norm_ops(TensorNode* dst, const Launch& L) {
  const RmsNormParams p = op_params<RmsNormParams>(*dst);
  const bool back = dst->op != Op::RMS_NORM;
  const TensorNode* x = dst->src[back ? 1 : 0];
  const int64_t d = x->shape[x->shape.ndim() - 1];
  float* out = static_cast<float*>(dst->data);
  const int64_t rows = d == 0 ? 0 : x->numel() / d;
  if (rows > INT32_MAX) fail(op_name(dst->op), "too many rows for one CUDA launch: ", rows);
  const char* xp = static_cast<const char*>(x->data);
  if (dst->op == Op::RMS_NORM_BACK_WEIGHT) {
    if (d == 0) return;
    if (rows == 0) {
      check(cudaMemsetAsync(out, 0, size_t(d) * sizeof(float), L.stream), "rms_norm_back_weight");
      return;
    }
    float* rstd = reinterpret_cast<float*>(L.ws);
    k_row_rstd<<<unsigned(rows), threads_for(d), 0, L.stream>>>(xp, rows_of(x), d, p.eps, rstd);
    check_launch("rms_norm_back_weight (rows)");
    const TensorNode* dy = dst->src[0];
    k_rms_norm_back_weight<<<grid_for(d), kThreads, 0, L.stream>>>(
        static_cast<const char*>(dy->data), rows_of(dy), xp, rows_of(x), rstd, rows, d, out);
    check_launch("rms_norm_back_weight");
    return;
  }
  if (rows == 0) return;
  const TensorNode* w = p.has_weight ? dst->src[back ? 2 : 1] : nullptr;
  const char* wp = w ? static_cast<const char*>(w->data) : nullptr;
  const int64_t ws = w ? w->stride[0] : 0;
  if (!back) {
    k_rms_norm<<<unsigned(rows), threads_for(d), 0, L.stream>>>(xp, rows_of(x), wp, ws, d, p.eps,
                                                                out);
  } else {
    const TensorNode* dy = dst->src[0];
    const TensorNode* res = p.has_residual ? dst->src[2 + int(p.has_weight)] : nullptr;
    k_rms_norm_back<<<unsigned(rows), threads_for(d), 0, L.stream>>>(
        static_cast<const char*>(dy->data), rows_of(dy), xp, rows_of(x), wp, ws,
        res ? static_cast<const char*>(res->data) : nullptr, res ? rows_of(res) : Rows{}, d, p.eps,
        out);
  }
  check_launch(op_name(dst->op));
}

size_t rms_norm_workspace(const TensorNode* dst) {
  const TensorNode* x = dst->src[1];
  const int64_t d = x->shape[x->shape.ndim() - 1];
  return d == 0 ? 0 : size_t(x->numel() / d) * sizeof(float);
}

}  // namespace

OpKernel norm_kernel(Op op) {
  switch (op) {
    case Op::RMS_NORM:
    case Op::RMS_NORM_BACK: return {all_f32, rms_norm_ops};
    case Op::RMS_NORM_BACK_WEIGHT: return {all_f32, rms_norm_ops, rms_norm_workspace};
    default: return {};  // LAYER_NORM and its backward ops: CPU
  }
}

}  // namespace kiln::cuda
