// Optimizer steps: ADAMW_STEP, SGD_STEP, in place on the param and its state,
// with the hyper-parameters read on the device (so a captured graph sees each
// step's values).
//
// Elementwise kernels share one shape (common.cuh): one thread per output
// element (grid-stride), operands addressed through Idx (any byte strides, numpy
// broadcasting), so each element is computed by the same expression whatever the
// launch shape: results never depend on it. dst may alias a source (in place):
// an element is read before it is written, by the same thread.
#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// ------------------------------------------------------------------ optimizer steps
// hp: the step's values laid out as AdamWHyper / SgdHyper (kiln/ext/op_params.h),
// elements `stride` bytes apart, read on the device so that a captured graph
// sees each step's values.
struct Hp {
  const char* p;
  int64_t stride;
  template <class H>
  __device__ H read() const {
    float v[hyper_floats<H>];
    for (int64_t k = 0; k < hyper_floats<H>; ++k) v[k] = ldf(p, k * stride);
    H h;
    memcpy(&h, v, sizeof(H));
    return h;
  }
};

__global__ void k_adamw(char* pd, Idx pi, const char* g, Idx gi, char* m, Idx mi, char* v, Idx vi,
                        Hp hp, int64_t n) {
  const AdamWHyper h = hp.read<AdamWHyper>();
  const float lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay,
              bc1 = h.bias_correction1, bc2 = h.bias_correction2, gs = h.grad_scale;
  const float keep = 1.0f - lr * wd, c1 = 1.0f - b1, c2 = 1.0f - b2;
  KILN_GRID_LOOP(i, n) {
    float& p = atf(pd, pi.off(i));
    float& mm = atf(m, mi.off(i));
    float& vv = atf(v, vi.off(i));
    const float gg = ldf(g, gi.off(i)) * gs;
    mm = fmaf(b1, mm, c1 * gg);
    vv = fmaf(b2, vv, c2 * (gg * gg));
    const float mh = mm * bc1;
    const float vh = sqrtf(vv * bc2) + eps;
    p = fmaf(-lr, mh / vh, p * keep);
  }
}

// ADAMW_STEP_MULTI: one thread per state element k (grid-stride); its segment
// is the last row whose state offset is <= k, found by binary search in the
// table copied to shared memory (S <= kMaxAdamWSegments, the builder's limit).
// The per-element arithmetic is k_adamw's, so both give the same bits. Rows
// the CPU kernel would refuse (out of bounds) are skipped, never written through.
__global__ void k_adamw_multi(float* param, int64_t P, const float* grad, float* m, float* v,
                              const char* hp, int64_t hs0, int64_t hs1, int64_t G, const char* segs,
                              int64_t ss0, int64_t ss1, int S, int64_t n) {
  extern __shared__ int4 seg[];
  for (int s = threadIdx.x; s < S; s += blockDim.x) {
    const char* r = segs + int64_t(s) * ss0;
    seg[s] = make_int4(ldi(r, 0), ldi(r, ss1), ldi(r, 2 * ss1), ldi(r, 3 * ss1));
  }
  __syncthreads();
  KILN_GRID_LOOP(k, n) {
    int lo = 0, hi = S - 1, f = -1;
    while (lo <= hi) {
      const int mid = (lo + hi) / 2;
      if (seg[mid].y <= k) {
        f = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    if (f < 0) continue;
    const int4 sg = seg[f];
    const int64_t j = k - sg.y;
    if (j >= sg.z || sg.x < 0 || sg.x + j >= P || sg.w < 0 || sg.w >= G) continue;
    const AdamWHyper h = Hp{hp + sg.w * hs0, hs1}.read<AdamWHyper>();
    const float lr = h.lr, b1 = h.beta1, b2 = h.beta2, eps = h.eps, wd = h.weight_decay,
                bc1 = h.bias_correction1, bc2 = h.bias_correction2, gs = h.grad_scale;
    const float keep = 1.0f - lr * wd, c1 = 1.0f - b1, c2 = 1.0f - b2;
    float& p = param[sg.x + j];
    float& mm = m[k];
    float& vv = v[k];
    const float gg = grad[k] * gs;
    mm = fmaf(b1, mm, c1 * gg);
    vv = fmaf(b2, vv, c2 * (gg * gg));
    const float mh = mm * bc1;
    const float vh = sqrtf(vv * bc2) + eps;
    p = fmaf(-lr, mh / vh, p * keep);
  }
}

__global__ void k_sgd(char* pd, Idx pi, const char* g, Idx gi, char* buf, Idx bi, Hp hp,
                      int64_t n) {
  const SgdHyper h = hp.read<SgdHyper>();
  const float lr = h.lr, mu = h.momentum, damp = h.dampening, wd = h.weight_decay,
              gs = h.grad_scale;
  const bool nesterov = h.nesterov != 0.0f, first = h.first_step != 0.0f;
  const float c = 1.0f - damp;
  KILN_GRID_LOOP(i, n) {
    float& p = atf(pd, pi.off(i));
    float gg = ldf(g, gi.off(i)) * gs + wd * p;
    if (buf) {
      float& b = atf(buf, bi.off(i));
      b = first ? gg : mu * b + c * gg;
      gg = nesterov ? gg + mu * b : b;
    }
    p = p - lr * gg;
  }
}

// f32 flat vectors and hp, the i32 table; S within the shared-memory table.
bool adamw_multi_supported(const TensorNode* n) {
  for (int i = 0; i < 5; ++i)
    if (n->src[i]->dtype != DType::f32) return false;
  return n->src[5]->dtype == DType::i32 && n->src[5]->shape[0] <= kMaxAdamWSegments;
}

Hp hp_of(const TensorNode* t) {
  return {static_cast<const char*>(t->data),
          t->shape.ndim() ? t->stride[size_t(t->shape.ndim() - 1)] : 4};
}

}  // namespace

void optim_ops(TensorNode* dst, const Launch& L) {
  TensorNode* p = dst->src[0];
  const TensorNode* g = dst->src[1];
  const int64_t n = p->numel();
  // dst aliases the param: read and write through src0's strides.
  char* pd = static_cast<char*>(dst->data);
  const char* gp = static_cast<const char*>(g->data);
  if (dst->op == Op::ADAMW_STEP) {
    TensorNode *m = dst->src[2], *v = dst->src[3];
    k_adamw<<<grid_for(n), kThreads, 0, L.stream>>>(
        pd, idx_of(p), gp, idx_of(g), static_cast<char*>(m->data), idx_of(m),
        static_cast<char*>(v->data), idx_of(v), hp_of(dst->src[4]), n);
    return check_launch("adamw_step");
  }
  if (dst->op == Op::ADAMW_STEP_MULTI) {
    // Flat, contiguous f32 vectors (the builder's checks).
    const TensorNode *m = dst->src[2], *v = dst->src[3], *hp = dst->src[4], *segs = dst->src[5];
    const int S = int(segs->shape[0]);
    const int64_t N = g->numel();
    if (S == 0 || N == 0) return;
    k_adamw_multi<<<grid_for(N), kThreads, size_t(S) * sizeof(int4), L.stream>>>(
        reinterpret_cast<float*>(pd), n, reinterpret_cast<const float*>(gp),
        static_cast<float*>(m->data), static_cast<float*>(v->data),
        static_cast<const char*>(hp->data), hp->stride[0], hp->stride[1], hp->shape[0],
        static_cast<const char*>(segs->data), segs->stride[0], segs->stride[1], S, N);
    return check_launch("adamw_step_multi");
  }
  if (dst->op == Op::SGD_STEP) {
    const bool has_buf = dst->n_src == 4;
    TensorNode* b = has_buf ? dst->src[2] : nullptr;
    k_sgd<<<grid_for(n), kThreads, 0, L.stream>>>(
        pd, idx_of(p), gp, idx_of(g), b ? static_cast<char*>(b->data) : nullptr,
        b ? idx_of(b) : Idx{}, hp_of(dst->src[dst->n_src - 1]), n);
    return check_launch("sgd_step");
  }
  fail("cuda", "optim_ops got ", op_name(dst->op));
}

OpKernel optim_kernel(Op op) {
  switch (op) {
    case Op::ADAMW_STEP:
    case Op::SGD_STEP: return {all_f32, optim_ops};
    case Op::ADAMW_STEP_MULTI: return {adamw_multi_supported, optim_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
