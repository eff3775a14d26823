// LAYER_NORM, LAYER_NORM_BACK and LAYER_NORM_BACK_AFFINE, and RMS_NORM,
// RMS_NORM_BACK and RMS_NORM_BACK_WEIGHT, over the last axis. Every sum is taken
// in a fixed order (block_reduce, warp butterflies, partial sums added in
// order): results depend on the values and the shapes only, never on timing.
// The RMS kernels and the layer norm's strided ones take one block per row and
// read the row from memory in each pass. Layer norm rows that are contiguous,
// 16-byte aligned and D % 4 == 0 (D <= 8192) stay in registers as float4s
// between the passes (read once; a warp per row up to D = 1024: no block
// barriers). Statistics follow the CPU kernel: mean, then the mean of squared
// deviations (no cancellation), biased, 1/sqrt(var + eps); the backward ops
// recompute them. The parameter gradients (RMS_NORM_BACK_WEIGHT,
// LAYER_NORM_BACK_AFFINE) write each row's statistics to the workspace first;
// RMS then sums each column over all rows in one thread, layer norm sums chunks
// of 32 rows per column in parallel (no float atomics: [16384, 384] would leave
// 384 threads a serial loop each) and adds the chunks' partial sums in order.
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// Where row r (all dims but the last) of a tensor starts, and its element step.
// rows_of merges leading dims that are one run of memory ([B, T, D] contiguous
// is [B*T, D]) and drops size-1 ones, so off() usually costs no division.
struct Rows {
  int nl;                    // leading dims after merging (0: a single row)
  int64_t shape[kMaxDims];   // of the leading dims
  int64_t stride[kMaxDims];  // bytes
  int64_t last;              // bytes between a row's elements
  // Unrolled over kMaxDims: constant indices keep the struct in the parameter
  // space (a runtime index would copy it to local memory in every thread).
  __device__ int64_t off(int64_t r) const {
    int64_t o = 0;
#pragma unroll
    for (int d = kMaxDims - 1; d > 0; --d) {
      if (d < nl) {
        o += (r % shape[d]) * stride[d];
        r /= shape[d];
      }
    }
    return nl > 0 ? o + r * stride[0] : 0;  // r < rows: no modulo for the outermost dim
  }
  __device__ int64_t step() const { return last; }
};

Rows rows_of(const TensorNode* t) {
  Rows r{};
  const int nd = t->shape.ndim();
  r.last = nd > 0 ? t->stride[size_t(nd - 1)] : 0;
  for (int d = 0; d + 1 < nd; ++d) {
    const int64_t n = t->shape[d], s = t->stride[size_t(d)];
    if (n == 1) continue;
    if (r.nl > 0 && r.stride[r.nl - 1] == s * n) {
      r.shape[r.nl - 1] *= n;
      r.stride[r.nl - 1] = s;
    } else {
      r.shape[r.nl] = n;
      r.stride[r.nl] = s;
      ++r.nl;
    }
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

// ---- LAYER_NORM, LAYER_NORM_BACK, LAYER_NORM_BACK_AFFINE

struct RowStats {
  float mean, rstd;
};

// y = xhat * w + b (a fused multiply-add, as the CPU kernel), or the terms present.
__device__ inline float ln_affine(float xh, float w, float b, bool hw, bool hb) {
  return hw && hb ? fmaf(xh, w, b) : hw ? xh * w : hb ? xh + b : xh;
}

// Sums a and b over the block as block_reduce does (both in one pass: one set of
// barriers). shm: 66 floats.
__device__ float2 block_sum2(float a, float b, float* shm) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5, nw = int(blockDim.x) >> 5;
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_down_sync(0xffffffffu, a, o);
    b += __shfl_down_sync(0xffffffffu, b, o);
  }
  __syncthreads();  // a previous call may still read shm
  if (lane == 0) {
    shm[w] = a;
    shm[33 + w] = b;
  }
  __syncthreads();
  if (w == 0) {
    a = lane < nw ? shm[lane] : 0.0f;
    b = lane < nw ? shm[33 + lane] : 0.0f;
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_down_sync(0xffffffffu, a, o);
      b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if (lane == 0) {
      shm[32] = a;
      shm[65] = b;
    }
  }
  __syncthreads();
  return make_float2(shm[32], shm[65]);
}

// The strided kernels (any byte strides, any D): one block per row, the row
// read again from memory (cache) in each pass.

// Mean, then the mean of squared deviations (two passes, no cancellation, as
// the CPU); biased variance; 1/sqrt, not the approximate rsqrtf.
__device__ RowStats ln_row_stats(const char* x, int64_t xo, int64_t xs, int64_t d, float eps,
                                 float* shm) {
  float s = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) s += ldf(x, xo + j * xs);
  const float mean = block_reduce(s, 0.0f, SumOp{}, shm) / float(d);
  float q = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float c = ldf(x, xo + j * xs) - mean;
    q = fmaf(c, c, q);
  }
  const float var = block_reduce(q, 0.0f, SumOp{}, shm) / float(d);
  return {mean, 1.0f / sqrtf(var + eps)};
}

__global__ void k_layer_norm(const char* x, Rows g, const char* w, int64_t ws, const char* b,
                             int64_t bs, int64_t d, float eps, float* out) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x, xo = g.off(r), xs = g.step();
  const RowStats st = ln_row_stats(x, xo, xs, d, eps, shm);
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    const float xh = (ldf(x, xo + j * xs) - st.mean) * st.rstd;
    out[r * d + j] = ln_affine(xh, w ? ldf(w, j * ws) : 0.0f, b ? ldf(b, j * bs) : 0.0f, w, b);
  }
}

// g = dy * w, xc = x - mean, S = sum(g * xc): dx = rstd * g - rstd * mean(g) -
// xc * rstd^3 S / d (the CPU kernel's form); plus row r of res when there is one.
__global__ void k_layer_norm_back(const char* dy, Rows gd, const char* x, Rows gx, const char* w,
                                  int64_t ws, const char* res, Rows gr, int64_t d, float eps,
                                  float* out) {
  __shared__ float shm[66];
  const int64_t r = blockIdx.x;
  const int64_t xo = gx.off(r), xs = gx.step(), go = gd.off(r), gs = gd.step();
  const RowStats st = ln_row_stats(x, xo, xs, d, eps, shm);
  float sg = 0.0f, sgc = 0.0f;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(dy, go + j * gs);
    if (w) g *= ldf(w, j * ws);
    sg += g;
    sgc = fmaf(g, ldf(x, xo + j * xs) - st.mean, sgc);
  }
  const float2 t = block_sum2(sg, sgc, shm);
  const float nb = -(st.rstd * st.rstd * st.rstd * (t.y / float(d)));
  const float c = -st.rstd * (t.x / float(d));
  const int64_t ro = res ? gr.off(r) : 0, rs = gr.step();
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    float g = ldf(dy, go + j * gs);
    if (w) g *= ldf(w, j * ws);
    const float dx = fmaf(g, st.rstd, fmaf(ldf(x, xo + j * xs) - st.mean, nb, c));
    out[r * d + j] = res ? ldf(res, ro + j * rs) + dx : dx;
  }
}

__global__ void k_ln_stats(const char* x, Rows g, int64_t d, float eps, float* mean, float* rstd) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x;
  const RowStats st = ln_row_stats(x, g.off(r), g.step(), d, eps, shm);
  if (threadIdx.x == 0) {
    mean[r] = st.mean;
    rstd[r] = st.rstd;
  }
}

// The float4 kernels: rows of contiguous, 16-byte aligned f32 (D % 4 == 0,
// D <= kMaxVecD), held in registers between the passes, so memory is read once.
// A row's team of kTeam threads is a warp (kTeam 32, D <= 1024: no block
// barriers, kWarpRows rows per block) or a whole block (256 or 512 threads);
// thread t holds float4s t, t + kTeam, ..., S of them (S <= 4 for a block: 8
// spills). The sums' order depends only on D.
constexpr int kWarpRows = 4;
constexpr int64_t kMaxVecD = 4 * 512 * 4;

template <int kTeam>
__device__ inline int team_tid() {
  return kTeam == 32 ? int(threadIdx.x) & 31 : int(threadIdx.x);
}
template <int kTeam>
__device__ inline int64_t team_row() {
  return kTeam == 32 ? int64_t(blockIdx.x) * kWarpRows + (threadIdx.x >> 5) : int64_t(blockIdx.x);
}
template <int kTeam>
__device__ inline float team_sum(float v, float* shm) {
  if constexpr (kTeam == 32) {
    // Butterfly: every lane ends with the same bits (a + b == b + a exactly).
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
  } else {
    return block_reduce(v, 0.0f, SumOp{}, shm);
  }
}
template <int kTeam>
__device__ inline float2 team_sum2(float a, float b, float* shm) {
  if constexpr (kTeam == 32) {
    for (int o = 16; o > 0; o >>= 1) {
      a += __shfl_xor_sync(0xffffffffu, a, o);
      b += __shfl_xor_sync(0xffffffffu, b, o);
    }
    return make_float2(a, b);
  } else {
    return block_sum2(a, b, shm);
  }
}

// Index of thread's k-th float4 of the row; it is in the row when 4 * c < d.
template <int kTeam>
__device__ inline int slot(int k) {
  return team_tid<kTeam>() + k * kTeam;
}

template <int S, int kTeam>
__device__ inline void load4(const char* p, int d, float4 (&v)[S]) {
  const float4* q = reinterpret_cast<const float4*>(p);
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int c = slot<kTeam>(k);
    v[k] = 4 * c < d ? __ldg(q + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
}

template <int S, int kTeam>
__device__ RowStats stats4(const float4 (&v)[S], int d, float eps, float* shm) {
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < S; ++k) s += (v[k].x + v[k].y) + (v[k].z + v[k].w);  // 0 outside the row
  const float mean = team_sum<kTeam>(s, shm) / float(d);
  float q = 0.0f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    if (4 * slot<kTeam>(k) >= d) continue;
    const float a = v[k].x - mean, b = v[k].y - mean, c = v[k].z - mean, e = v[k].w - mean;
    q = fmaf(a, a, q);
    q = fmaf(b, b, q);
    q = fmaf(c, c, q);
    q = fmaf(e, e, q);
  }
  const float var = team_sum<kTeam>(q, shm) / float(d);
  return {mean, 1.0f / sqrtf(var + eps)};
}

template <int S, int kTeam>
__global__ void __launch_bounds__(kTeam == 32 ? 32 * kWarpRows : kTeam)
    k_layer_norm4(const char* x, Rows g, const float* w, const float* b, int64_t rows, int d,
                  float eps, float* out) {
  __shared__ float shm[33];
  const int64_t r = team_row<kTeam>();
  if (r >= rows) return;  // a whole warp (warp teams), or never (a block per row)
  float4 v[S];
  load4<S, kTeam>(x + g.off(r), d, v);
  const RowStats st = stats4<S, kTeam>(v, d, eps, shm);
  float4* o = reinterpret_cast<float4*>(out + r * d);
  const bool hw = w, hb = b;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int c = slot<kTeam>(k);
    if (4 * c >= d) continue;
    const float4 wv = hw ? __ldg(reinterpret_cast<const float4*>(w) + c) : float4{};
    const float4 bv = hb ? __ldg(reinterpret_cast<const float4*>(b) + c) : float4{};
    float4 y;
    y.x = ln_affine((v[k].x - st.mean) * st.rstd, wv.x, bv.x, hw, hb);
    y.y = ln_affine((v[k].y - st.mean) * st.rstd, wv.y, bv.y, hw, hb);
    y.z = ln_affine((v[k].z - st.mean) * st.rstd, wv.z, bv.z, hw, hb);
    y.w = ln_affine((v[k].w - st.mean) * st.rstd, wv.w, bv.w, hw, hb);
    o[c] = y;
  }
}

// As k_layer_norm_back, with x and g = dy * w kept in registers.
template <int S, int kTeam>
__global__ void __launch_bounds__(kTeam == 32 ? 32 * kWarpRows : kTeam)
    k_layer_norm_back4(const char* dy, Rows gd, const char* x, Rows gx, const float* w,
                       const char* res, Rows gr, int64_t rows, int d, float eps, float* out) {
  __shared__ float shm[66];
  const int64_t r = team_row<kTeam>();
  if (r >= rows) return;
  float4 xv[S], gv[S];
  load4<S, kTeam>(x + gx.off(r), d, xv);
  load4<S, kTeam>(dy + gd.off(r), d, gv);
  const RowStats st = stats4<S, kTeam>(xv, d, eps, shm);
  float sg = 0.0f, sgc = 0.0f;
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int c = slot<kTeam>(k);
    if (4 * c >= d) continue;
    if (w) {
      const float4 wv = __ldg(reinterpret_cast<const float4*>(w) + c);
      gv[k].x *= wv.x;
      gv[k].y *= wv.y;
      gv[k].z *= wv.z;
      gv[k].w *= wv.w;
    }
    sg += (gv[k].x + gv[k].y) + (gv[k].z + gv[k].w);
    sgc = fmaf(gv[k].x, xv[k].x - st.mean, sgc);
    sgc = fmaf(gv[k].y, xv[k].y - st.mean, sgc);
    sgc = fmaf(gv[k].z, xv[k].z - st.mean, sgc);
    sgc = fmaf(gv[k].w, xv[k].w - st.mean, sgc);
  }
  const float2 t = team_sum2<kTeam>(sg, sgc, shm);
  const float nb = -(st.rstd * st.rstd * st.rstd * (t.y / float(d)));
  const float cc = -st.rstd * (t.x / float(d));
  const float4* rp = res ? reinterpret_cast<const float4*>(res + gr.off(r)) : nullptr;
  float4* o = reinterpret_cast<float4*>(out + r * d);
#pragma unroll
  for (int k = 0; k < S; ++k) {
    const int c = slot<kTeam>(k);
    if (4 * c >= d) continue;
    float4 dx;
    dx.x = fmaf(gv[k].x, st.rstd, fmaf(xv[k].x - st.mean, nb, cc));
    dx.y = fmaf(gv[k].y, st.rstd, fmaf(xv[k].y - st.mean, nb, cc));
    dx.z = fmaf(gv[k].z, st.rstd, fmaf(xv[k].z - st.mean, nb, cc));
    dx.w = fmaf(gv[k].w, st.rstd, fmaf(xv[k].w - st.mean, nb, cc));
    if (rp) {
      const float4 rv = __ldg(rp + c);
      dx.x += rv.x;
      dx.y += rv.y;
      dx.z += rv.z;
      dx.w += rv.w;
    }
    o[c] = dx;
  }
}

template <int S, int kTeam>
__global__ void __launch_bounds__(kTeam == 32 ? 32 * kWarpRows : kTeam)
    k_ln_stats4(const char* x, Rows g, int64_t rows, int d, float eps, float* mean, float* rstd) {
  __shared__ float shm[33];
  const int64_t r = team_row<kTeam>();
  if (r >= rows) return;
  float4 v[S];
  load4<S, kTeam>(x + g.off(r), d, v);
  const RowStats st = stats4<S, kTeam>(v, d, eps, shm);
  if (team_tid<kTeam>() == 0) {
    mean[r] = st.mean;
    rstd[r] = st.rstd;
  }
}

// LAYER_NORM_BACK_AFFINE's column sums, deterministic in two stages: block
// (tile, chunk) sums rows [chunk * kAffineChunk, +kAffineChunk) in order for
// kAffineCols columns, one thread per column (a warp reads a row's consecutive
// columns), into part[chunk] (2 * D floats: d weight, then d bias); then
// k_ln_affine_sum adds the chunks' partial sums in a fixed order. The row
// statistics come first from the row kernels (workspace).
constexpr int kAffineChunk = 32;
constexpr int kAffineCols = 128;

__global__ void __launch_bounds__(kAffineCols)
    k_ln_affine_part(const char* dy, Rows gd, const char* x, Rows gx, const float* mean,
                     const float* rstd, int64_t rows, int64_t d, float* part) {
  __shared__ float sm[kAffineChunk], sr[kAffineChunk];
  __shared__ int64_t sxo[kAffineChunk], sdo[kAffineChunk];
  const int64_t r0 = int64_t(blockIdx.x) * kAffineChunk;
  const int nr = rows - r0 < kAffineChunk ? int(rows - r0) : kAffineChunk;
  for (int i = threadIdx.x; i < nr; i += blockDim.x) {
    sm[i] = mean[r0 + i];
    sr[i] = rstd[r0 + i];
    sxo[i] = gx.off(r0 + i);
    sdo[i] = gd.off(r0 + i);
  }
  __syncthreads();
  const int64_t c = int64_t(blockIdx.y) * kAffineCols + threadIdx.x;
  if (c >= d) return;
  const int64_t xc = c * gx.step(), dc = c * gd.step();
  float aw = 0.0f, ab = 0.0f;
  auto add_row = [&](int i) {
    const float g = ldf(dy, sdo[i] + dc);
    aw = fmaf(g, (ldf(x, sxo[i] + xc) - sm[i]) * sr[i], aw);
    ab += g;
  };
  if (nr == kAffineChunk) {
#pragma unroll
    for (int i = 0; i < kAffineChunk; ++i) add_row(i);  // loads issued ahead of the sums
  } else {
    for (int i = 0; i < nr; ++i) add_row(i);
  }
  float* p = part + int64_t(blockIdx.x) * 2 * d;
  p[c] = aw;
  p[d + c] = ab;
}

// out[c] = sum over chunks of part[chunk * width + c]: block (32, 32), thread
// (tx, ty) sums chunks ty, ty + 32, ... of column c (coalesced across tx), then
// the 32 sums of a column are added in ty order.
__global__ void __launch_bounds__(1024)
    k_ln_affine_sum(const float* part, int64_t chunks, int64_t width, float* out) {
  __shared__ float sh[32][33];
  const int64_t c = int64_t(blockIdx.x) * 32 + threadIdx.x;
  float acc = 0.0f;
  if (c < width)
    for (int64_t k = threadIdx.y; k < chunks; k += 32) acc += part[k * width + c];
  sh[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < width) {
    float s = 0.0f;
    for (int k = 0; k < 32; ++k) s += sh[k][threadIdx.x];
    out[c] = s;
  }
}

// Host side: which kernels a node's rows take.
struct VecPlan {
  bool ok = false;  // the float4 kernels
  int team = 0;     // kTeam
  int slots = 0;    // S
};

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }
// Rows of t (of D % 4 == 0 elements) are contiguous and 16-byte aligned.
bool vec_rows(const TensorNode* t, const Rows& g) {
  if (!aligned16(t->data) || g.last != 4) return false;
  for (int i = 0; i < g.nl; ++i)
    if (g.stride[i] % 16 != 0) return false;
  return true;
}
bool vec_param(const TensorNode* t) { return !t || (aligned16(t->data) && t->stride[0] == 4); }

// The team and S for D (whether the tensors suit the float4 kernels is checked
// apart): a warp for D <= 1024, S = ceil(D / 128) (5 and 7 rounded up); then
// 256 threads with S = 2 or 4, and 512 threads with S = 4.
VecPlan vec_plan(int64_t d) {
  VecPlan p;
  if (d == 0 || d % 4 != 0 || d > kMaxVecD) return p;
  p.ok = true;
  if (d <= 4 * 32 * 8) {
    p.team = 32;
    p.slots = int((d + 127) / 128);
    if (p.slots == 5 || p.slots == 7) ++p.slots;
  } else {
    p.team = d <= 4 * 256 * 4 ? 256 : 512;
    p.slots = d <= 4 * 256 * 2 ? 2 : 4;
  }
  return p;
}

template <int S, int T>
struct Slots {
  static constexpr int s = S;
  static constexpr int team = T;
};
// f(Slots<S, team>{}) for the plan (the instantiated ones).
template <class F>
void with_slots(const VecPlan& p, F&& f) {
  if (p.team == 32) {
    switch (p.slots) {
      case 1: f(Slots<1, 32>{}); break;
      case 2: f(Slots<2, 32>{}); break;
      case 3: f(Slots<3, 32>{}); break;
      case 4: f(Slots<4, 32>{}); break;
      case 6: f(Slots<6, 32>{}); break;
      default: f(Slots<8, 32>{}); break;
    }
  } else if (p.team == 256) {
    if (p.slots == 2) f(Slots<2, 256>{});
    else f(Slots<4, 256>{});
  } else {
    f(Slots<4, 512>{});
  }
}
unsigned vec_grid(const VecPlan& p, int64_t rows) {
  return unsigned(p.team == 32 ? (rows + kWarpRows - 1) / kWarpRows : rows);
}
int vec_threads(const VecPlan& p) { return p.team == 32 ? 32 * kWarpRows : p.team; }

int64_t affine_chunks(int64_t rows) { return (rows + kAffineChunk - 1) / kAffineChunk; }

// Writes each row's mean and rstd (LAYER_NORM_BACK_AFFINE's first step).
void ln_stats(const TensorNode* x, int64_t rows, int64_t d, float eps, float* mean, float* rstd,
              const Launch& L) {
  const char* xp = static_cast<const char*>(x->data);
  const Rows g = rows_of(x);
  VecPlan vp = vec_plan(d);
  vp.ok = vp.ok && vec_rows(x, g);
  if (vp.ok) {
    with_slots(vp, [&](auto sl) {
      using SL = decltype(sl);
      k_ln_stats4<SL::s, SL::team><<<vec_grid(vp, rows), vec_threads(vp), 0, L.stream>>>(
          xp, g, rows, int(d), eps, mean, rstd);
    });
  } else {
    k_ln_stats<<<unsigned(rows), threads_for(d), 0, L.stream>>>(xp, g, d, eps, mean, rstd);
  }
  check_launch("layer_norm_back_affine (rows)");
}

void layer_norm_back_affine(TensorNode* dst, const Launch& L) {
  const LayerNormParams p = op_params<LayerNormParams>(*dst);
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const int64_t d = x->shape[x->shape.ndim() - 1];
  if (d == 0) return;
  const int64_t rows = x->numel() / d;
  float* out = static_cast<float*>(dst->data);
  if (rows == 0) {
    check(cudaMemsetAsync(out, 0, size_t(2 * d) * sizeof(float), L.stream),
          "layer_norm_back_affine");
    return;
  }
  if (rows > INT32_MAX) fail("layer_norm_back_affine", "too many rows for one CUDA launch: ", rows);
  const int64_t tiles = (d + kAffineCols - 1) / kAffineCols, chunks = affine_chunks(rows);
  if (tiles > 65535) fail("layer_norm_back_affine", "too many columns for one CUDA launch: ", d);
  float* mean = reinterpret_cast<float*>(L.ws);
  float* rstd = mean + rows;
  float* part = rstd + rows;
  ln_stats(x, rows, d, p.eps, mean, rstd, L);
  k_ln_affine_part<<<dim3(unsigned(chunks), unsigned(tiles)), kAffineCols, 0, L.stream>>>(
      static_cast<const char*>(dy->data), rows_of(dy), static_cast<const char*>(x->data),
      rows_of(x), mean, rstd, rows, d, part);
  check_launch("layer_norm_back_affine (chunks)");
  k_ln_affine_sum<<<unsigned((2 * d + 31) / 32), dim3(32, 32), 0, L.stream>>>(part, chunks, 2 * d,
                                                                              out);
  check_launch("layer_norm_back_affine");
}

size_t layer_norm_back_affine_workspace(const TensorNode* dst) {
  const TensorNode* x = dst->src[1];
  const int64_t d = x->shape[x->shape.ndim() - 1];
  const int64_t rows = d == 0 ? 0 : x->numel() / d;
  if (rows == 0) return 0;
  return size_t(2 * rows + affine_chunks(rows) * 2 * d) * sizeof(float);
}

void layer_norm_ops(TensorNode* dst, const Launch& L) {
  if (dst->op == Op::LAYER_NORM_BACK_AFFINE) return layer_norm_back_affine(dst, L);
  const LayerNormParams p = op_params<LayerNormParams>(*dst);
  const bool back = dst->op == Op::LAYER_NORM_BACK;
  const TensorNode* x = dst->src[back ? 1 : 0];
  const int64_t d = x->shape[x->shape.ndim() - 1];
  const int64_t rows = d == 0 ? 0 : x->numel() / d;
  if (rows == 0) return;
  if (rows > INT32_MAX) fail(op_name(dst->op), "too many rows for one CUDA launch: ", rows);
  float* out = static_cast<float*>(dst->data);
  const char* xp = static_cast<const char*>(x->data);
  const Rows gx = rows_of(x);
  VecPlan vp = vec_plan(d);
  vp.ok = vp.ok && aligned16(out) && vec_rows(x, gx);
  auto ptr = [](const TensorNode* t) {
    return t ? static_cast<const char*>(t->data) : static_cast<const char*>(nullptr);
  };
  if (!back) {
    const TensorNode* w = p.has_weight ? dst->src[1] : nullptr;
    const TensorNode* b = p.has_bias ? dst->src[1 + int(p.has_weight)] : nullptr;
    if (vp.ok && vec_param(w) && vec_param(b)) {
      with_slots(vp, [&](auto sl) {
        using SL = decltype(sl);
        k_layer_norm4<SL::s, SL::team><<<vec_grid(vp, rows), vec_threads(vp), 0, L.stream>>>(
            xp, gx, reinterpret_cast<const float*>(ptr(w)), reinterpret_cast<const float*>(ptr(b)),
            rows, int(d), p.eps, out);
      });
    } else {
      k_layer_norm<<<unsigned(rows), threads_for(d), 0, L.stream>>>(
          xp, gx, ptr(w), w ? w->stride[0] : 0, ptr(b), b ? b->stride[0] : 0, d, p.eps, out);
    }
  } else {
    const TensorNode* dy = dst->src[0];
    const TensorNode* w = p.has_weight ? dst->src[2] : nullptr;
    const TensorNode* res = p.has_residual ? dst->src[2 + int(p.has_weight)] : nullptr;
    const Rows gd = rows_of(dy), gr = res ? rows_of(res) : Rows{};
    if (vp.ok && vec_rows(dy, gd) && (!res || vec_rows(res, gr)) && vec_param(w)) {
      with_slots(vp, [&](auto sl) {
        using SL = decltype(sl);
        k_layer_norm_back4<SL::s, SL::team><<<vec_grid(vp, rows), vec_threads(vp), 0, L.stream>>>(
            ptr(dy), gd, xp, gx, reinterpret_cast<const float*>(ptr(w)), ptr(res), gr, rows, int(d),
            p.eps, out);
      });
    } else {
      k_layer_norm_back<<<unsigned(rows), threads_for(d), 0, L.stream>>>(
          ptr(dy), gd, xp, gx, ptr(w), w ? w->stride[0] : 0, ptr(res), gr, d, p.eps, out);
    }
  }
  check_launch(op_name(dst->op));
}

}  // namespace

OpKernel norm_kernel(Op op) {
  switch (op) {
    case Op::RMS_NORM:
    case Op::RMS_NORM_BACK: return {all_f32, rms_norm_ops};
    case Op::RMS_NORM_BACK_WEIGHT: return {all_f32, rms_norm_ops, rms_norm_workspace};
    case Op::LAYER_NORM:
    case Op::LAYER_NORM_BACK: return {all_f32, layer_norm_ops};
    case Op::LAYER_NORM_BACK_AFFINE:
      return {all_f32, layer_norm_ops, layer_norm_back_affine_workspace};
    default: return {};
  }
}

}  // namespace kiln::cuda
