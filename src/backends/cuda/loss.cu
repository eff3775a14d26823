// CROSS_ENTROPY and CROSS_ENTROPY_BACK: f32 logits [N, C] (any byte strides)
// with i32 labels [N], as the CPU kernels (cpu/kernels/loss.cpp).
//
// A row gives its max M and ls = log(sum exp(x - M)), combined in a fixed
// order (results never depend on timing). Rows of up to 1024 columns (GPT's
// 256, MNIST's 10) take a warp each, the row in registers: max, then the sum
// of exp(x - M), as the CPU. Longer rows (an LM head's vocabulary) take a
// block each: every thread keeps a running max and rescaled sum over its
// columns (one read of the row), then block_reduce combines them.
// As on the CPU: a -inf logit adds exp(-inf) = 0 (the loss stays finite), a
// NaN makes ls NaN, and a row whose max is +inf or -inf (all -inf) gets
// ls = NaN, as the CPU's exp(inf - inf) does.
// Forward: the row loss (M - x[label]) + ls goes to the workspace; then one
// block adds the N row losses in double (a fixed combining order, no float
// atomics: the same bits on every run) and divides by N (NaN for N = 0).
// Backward: exp((x - M) - ls) * g / N, minus g / N at the label, with g read
// from device memory (no host read: graph capture works); a bf16 dst (a fused
// cast) rounds that f32 value.
// Labels outside [0, C) are index errors: a row's warp or block records the
// row in L.err (the smallest wins); the backend throws the CPU's message
// "[cross_entropy] label v at position r is out of range [0, C)".
// The masked forms (CrossEntropyParams: ignore_index, per-row weights) are
// declined (loss_supports) and run on the CPU.
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

__device__ inline float quiet_nan() { return __int_as_float(0x7fc00000); }

// Rows of at most kWarpCols columns: a warp per row (kRowWarps rows per block),
// the row in registers (K columns per lane), warp shuffles only. Longer rows: a
// block per row.
constexpr int kWarpCols = 1024, kRowWarps = 8;

// Threads of a long row's block: about 8 columns each, up to 1024.
int row_threads(int64_t c) {
  int t = 32;
  while (t < 1024 && int64_t(t) * 8 < c) t *= 2;
  return t;
}

// All lanes get the same value (xor butterflies: a + b and b + a are the same bits).
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// One warp per row, lane l holding columns l, l + 32, ..., of the row: the max
// of the non-NaN entries, then sum exp(x - max) (as the CPU kernel). Forward:
// loss[r]; backward (kBack): out row r.
template <int K, bool kBack>
__global__ void __launch_bounds__(32 * kRowWarps)
    k_ce_warp(const char* x, int64_t rs, int64_t cs, int64_t n, int64_t c, const char* lab,
              int64_t lst, const float* g, float* loss, char* out, bool bf16,
              unsigned long long* err) {
  const int lane = int(threadIdx.x) & 31;
  const int64_t r = int64_t(blockIdx.x) * kRowWarps + (threadIdx.x >> 5);
  if (r >= n) return;  // the whole warp: no block barrier below
  const int64_t xo = r * rs;
  float v[K];
  float m = -INFINITY;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int64_t j = lane + 32 * k;
    v[k] = j < c ? ldf(x, xo + j * cs) : -INFINITY;
    m = v[k] > m ? v[k] : m;
  }
  const float mx = warp_max(m);
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < K; ++k)
    if (lane + 32 * k < c) s += expf(v[k] - mx);  // -inf adds 0; a NaN makes s NaN
  s = warp_sum(s);
  // A max of +inf or -inf (every entry -inf) is NaN, as the CPU's exp(inf - inf).
  const float ls = (mx > -INFINITY && mx < INFINITY) ? logf(s) : quiet_nan();
  const int32_t t = ldi(lab, r * lst);
  const bool bad = t < 0 || t >= c;
  if (lane == 0 && bad) report_bad(err, r);
  if constexpr (kBack) {
    const float gs = *g / float(n);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int64_t j = lane + 32 * k;
      if (j >= c) break;
      float o = expf((v[k] - mx) - ls) * gs;
      if (j == t) o -= gs;  // a bad label matches no column
      if (bf16) reinterpret_cast<uint16_t*>(out)[r * c + j] = to_bf16(o);
      else reinterpret_cast<float*>(out)[r * c + j] = o;
    }
  } else if (lane == 0) {
    // (max - target) + log(sum): keeps precision when |max| is large (the CPU's order).
    loss[r] = bad ? quiet_nan() : (mx - ldf(x, xo + t * cs)) + ls;
  }
}

// log(sum(exp(x - M))) of the row at x + xo (c columns, cs bytes apart), M its
// max (in *mx); NaN when M is not finite. Every thread of the block gets both.
__device__ float row_log_sum(const char* x, int64_t xo, int64_t cs, int64_t c, float* shm,
                             float* mx) {
  float m = -INFINITY, s = 0.0f;
#pragma unroll 8
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    const float v = ldf(x, xo + j * cs);
    if (v > m) {  // a new max: rescale (s * 0 while m is -inf; a NaN s stays NaN)
      s = s * expf(m - v) + 1.0f;
      m = v;
    } else if (v != -INFINITY) {  // -inf adds 0 (and no -inf - -inf); NaN makes s NaN
      s += expf(v - m);
    }
  }
  const float M = block_reduce(m, -INFINITY, MaxNanOp{}, shm);  // m is never NaN
  s = block_reduce(s * expf(m - M), 0.0f, SumOp{}, shm);
  *mx = M;
  return (M > -INFINITY && M < INFINITY) ? logf(s) : quiet_nan();
}

__global__ void __launch_bounds__(1024)
    k_ce_rows(const char* x, int64_t rs, int64_t cs, int64_t c, const char* lab, int64_t lst,
              float* loss, unsigned long long* err) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x, xo = r * rs;
  float mx;
  const float ls = row_log_sum(x, xo, cs, c, shm, &mx);
  if (threadIdx.x != 0) return;
  const int32_t t = ldi(lab, r * lst);
  if (t < 0 || t >= c) {
    report_bad(err, r);
    loss[r] = quiet_nan();
    return;
  }
  // (max - target) + log(sum): keeps precision when |max| is large (the CPU's order).
  loss[r] = (mx - ldf(x, xo + t * cs)) + ls;
}

// *out = mean of loss[0, n): in double, thread k adding rows k, k + T, ..., then
// block_reduce; NaN for n = 0 (PyTorch's mean of nothing).
__global__ void __launch_bounds__(1024) k_ce_mean(const float* loss, int64_t n, float* out) {
  __shared__ double shm[33];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += double(loss[i]);
  s = block_reduce(s, 0.0, SumOp{}, shm);
  if (threadIdx.x == 0) *out = n ? float(s / double(n)) : quiet_nan();
}

// out[r, j] = (softmax(row r)[j] - (j == label r)) * g / n.
__global__ void __launch_bounds__(1024)
    k_ce_back(const char* x, int64_t rs, int64_t cs, int64_t c, const char* lab, int64_t lst,
              const float* g, int64_t n, char* out, bool bf16, unsigned long long* err) {
  __shared__ float shm[33];
  const int64_t r = blockIdx.x, xo = r * rs;
  const int32_t t = ldi(lab, r * lst);  // a bad label matches no column
  if (threadIdx.x == 0 && (t < 0 || t >= c)) report_bad(err, r);
  float mx;
  const float ls = row_log_sum(x, xo, cs, c, shm, &mx);
  const float gs = *g / float(n);
  for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
    float v = expf((ldf(x, xo + j * cs) - mx) - ls) * gs;
    if (j == t) v -= gs;
    const int64_t o = r * c + j;
    if (bf16) reinterpret_cast<uint16_t*>(out)[o] = to_bf16(v);
    else reinterpret_cast<float*>(out)[o] = v;
  }
}

bool loss_supports(const TensorNode* n) {
  // Masked (ignore_index, per-row weights): not implemented here; the scheduler
  // runs those nodes on the CPU.
  if (prm::cross_entropy_masked(n)) return false;
  const TensorNode *x = n->src[0], *lab = n->src[1];
  if (!x || !lab || x->dtype != DType::f32 || x->shape.ndim() != 2) return false;
  if (lab->dtype != DType::i32 || lab->shape.ndim() != 1 || lab->shape[0] != x->shape[0])
    return false;
  if (n->op == Op::CROSS_ENTROPY) return n->dtype == DType::f32;
  const TensorNode* g = n->src[2];
  return (n->dtype == DType::f32 || n->dtype == DType::bf16) && g && g->dtype == DType::f32 &&
         g->numel() == 1;
}

size_t loss_workspace(const TensorNode* dst) {  // CROSS_ENTROPY's row losses
  return size_t(dst->src[0]->shape[0]) * sizeof(float);
}

// The warp-per-row kernel for c <= kWarpCols columns, K = columns per lane.
template <bool kBack>
void launch_warp_rows(int64_t c, unsigned blocks, cudaStream_t st, const char* x, int64_t rs,
                      int64_t cs, int64_t n, const char* lab, int64_t lst, const float* g,
                      float* loss, char* out, bool bf16, unsigned long long* err) {
  const int th = 32 * kRowWarps;
#define KILN_CE_WARP(K) \
  k_ce_warp<K, kBack><<<blocks, th, 0, st>>>(x, rs, cs, n, c, lab, lst, g, loss, out, bf16, err)
  if (c <= 32) KILN_CE_WARP(1);
  else if (c <= 64) KILN_CE_WARP(2);
  else if (c <= 128) KILN_CE_WARP(4);
  else if (c <= 256) KILN_CE_WARP(8);
  else if (c <= 512) KILN_CE_WARP(16);
  else KILN_CE_WARP(32);
#undef KILN_CE_WARP
}

void loss_ops(TensorNode* dst, const Launch& L) {
  const TensorNode *x = dst->src[0], *lab = dst->src[1];
  const int64_t n = x->shape[0], c = x->shape[1];
  if (n > INT32_MAX) fail("cross_entropy", "too many rows for one CUDA launch: ", n);
  const char* xp = static_cast<const char*>(x->data);
  const char* lp = static_cast<const char*>(lab->data);
  const int64_t rs = x->stride[0], cs = x->stride[1], lst = lab->stride[0];
  const bool warp = c <= kWarpCols;
  const unsigned blocks = unsigned(warp ? (n + kRowWarps - 1) / kRowWarps : n);
  const int threads = row_threads(c);
  if (dst->op == Op::CROSS_ENTROPY) {
    float* loss = reinterpret_cast<float*>(L.ws);
    if (n > 0) {  // C = 0 still runs: every label is out of range
      if (warp)
        launch_warp_rows<false>(c, blocks, L.stream, xp, rs, cs, n, lp, lst, nullptr, loss, nullptr,
                                false, L.err);
      else k_ce_rows<<<blocks, threads, 0, L.stream>>>(xp, rs, cs, c, lp, lst, loss, L.err);
      check_launch("cross_entropy");
    }
    int mt = 32;
    while (mt < 1024 && mt < n) mt *= 2;
    k_ce_mean<<<1, mt, 0, L.stream>>>(loss, n, static_cast<float*>(dst->data));
    check_launch("cross_entropy (mean)");
  } else {
    if (n == 0) return;
    const float* g = static_cast<const float*>(dst->src[2]->data);
    char* out = static_cast<char*>(dst->data);
    const bool bf16 = dst->dtype == DType::bf16;
    if (warp)
      launch_warp_rows<true>(c, blocks, L.stream, xp, rs, cs, n, lp, lst, g, nullptr, out, bf16,
                             L.err);
    else
      k_ce_back<<<blocks, threads, 0, L.stream>>>(xp, rs, cs, c, lp, lst, g, n, out, bf16, L.err);
    check_launch("cross_entropy_back");
  }
}

}  // namespace

OpKernel loss_kernel(Op op) {
  switch (op) {
    case Op::CROSS_ENTROPY: return {loss_supports, loss_ops, loss_workspace, true};
    case Op::CROSS_ENTROPY_BACK: return {loss_supports, loss_ops, nullptr, true};
    default: return {};
  }
}

}  // namespace kiln::cuda
