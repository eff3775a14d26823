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
    default: return {};
  }
}

}  // namespace kiln::cuda
