// Elementwise kernels: copies and constants (CPY FILL RAND_MASK), broadcasting
// binary ops (ADD SUB MUL DIV CMP WHERE ACCUMULATE), unary math (NEG ..
// SOFTPLUS) and the optimizer steps (OPT_STEP_ADAMW OPT_STEP_SGD).
//
// One thread per output element (grid-stride), operands addressed through Idx
// (any byte strides, numpy broadcasting), so each element is computed by the
// same expression whatever the launch shape: results never depend on it. dst
// may alias a source (in place): an element is read before it is written, by
// the same thread. The math follows the CPU kernels' definitions (NaN rules of
// sign, clamp, relu, softplus; the stable sigmoid; gelu's tanh form as
// x * sigmoid(2u)); libdevice's expf/logf/tanhf/erff are within a few ulp.
#include <cstring>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/detail/rng.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// ------------------------------------------------------------------ copies
__global__ void k_copy(char* d, Idx di, const char* s, Idx si, DType dt, DType st, int64_t n) {
  const int es = dt == DType::f16 || dt == DType::bf16 ? 2 : 4;
  KILN_GRID_LOOP(i, n) {
    const char* sp = s + si.off(i);
    char* dp = d + di.off(i);
    if (dt == st) copy_elem(dp, sp, es);  // same dtype: the bits (i32 beyond 2^24 stays exact)
    else store_from_f32(dp, dt, load_as_f32(sp, st));
  }
}

__global__ void k_fill(char* d, Idx di, uint32_t bits, int es, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    char* p = d + di.off(i);
    if (es == 4) *reinterpret_cast<uint32_t*>(p) = bits;
    else *reinterpret_cast<uint16_t*>(p) = uint16_t(bits);
  }
}

__global__ void k_rand_mask(char* d, Idx di, uint64_t seed, const int32_t* seed_t, float p,
                            int64_t n) {
  if (seed_t) seed ^= uint64_t(int64_t(*seed_t));
  KILN_GRID_LOOP(i, n) atf(d, di.off(i)) = detail::rng_uniform(seed, uint64_t(i)) < p ? 1.0f : 0.0f;
}

// The bits FILL/PAD store for value v in dtype t (as the CPU's store_f32).
uint32_t fill_bits(DType t, float v) {
  switch (t) {
    case DType::f32: {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      return b;
    }
    case DType::f16: return f32_to_f16(v);
    case DType::bf16: return f32_to_bf16(v);
    case DType::i32: {
      int32_t i = !(v == v)            ? 0
                  : v >= 2147483648.0f ? INT_MAX
                  : v < -2147483648.0f ? INT_MIN
                                       : int32_t(v);
      uint32_t b;
      std::memcpy(&b, &i, 4);
      return b;
    }
  }
  return 0;
}

// ------------------------------------------------------------------ binary
enum BinOp { kAdd, kSub, kMul, kDiv };

template <int Op>
__global__ void k_binary(char* d, Idx di, const char* a, Idx ai, const char* b, Idx bi, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const float x = ldf(a, ai.off(i)), y = ldf(b, bi.off(i));
    float r;
    if constexpr (Op == kAdd) r = x + y;
    else if constexpr (Op == kSub) r = x - y;
    else if constexpr (Op == kMul) r = x * y;
    else r = x / y;
    atf(d, di.off(i)) = r;
  }
}

template <class T>
__device__ inline bool compare(int mode, T x, T y) {
  switch (mode) {
    case 0: return x == y;
    case 1: return x != y;
    case 2: return x < y;
    case 3: return x <= y;
    case 4: return x > y;
    default: return x >= y;
  }
}

__global__ void k_cmp(char* d, Idx di, const char* a, Idx ai, const char* b, Idx bi, int mode,
                      bool ints, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    bool r;
    if (ints) r = compare(mode, ldi(a, ai.off(i)), ldi(b, bi.off(i)));
    else r = compare(mode, ldf(a, ai.off(i)), ldf(b, bi.off(i)));
    atf(d, di.off(i)) = r ? 1.0f : 0.0f;
  }
}

// cond != 0 ? x : y; an f32 cond that is NaN counts as true, -0 as false.
__global__ void k_where(char* d, Idx di, const char* c, Idx ci, bool cint, const char* x, Idx xi,
                        const char* y, Idx yi, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const bool cond = cint ? ldi(c, ci.off(i)) != 0 : ldf(c, ci.off(i)) != 0.0f;
    const char* s = cond ? x + xi.off(i) : y + yi.off(i);
    *reinterpret_cast<uint32_t*>(d + di.off(i)) = *reinterpret_cast<const uint32_t*>(s);
  }
}

// ------------------------------------------------------------------ unary
__device__ inline float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}

template <Op O>
__device__ inline float unary(float x, float a, float b) {
  if constexpr (O == Op::NEG) return -x;
  else if constexpr (O == Op::ABS) return fabsf(x);
  else if constexpr (O == Op::SIGN)
    return x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f;  // NaN: 0 (torch)
  else if constexpr (O == Op::SQR) return x * x;
  else if constexpr (O == Op::SQRT) return sqrtf(x);
  else if constexpr (O == Op::EXP) return expf(x);
  else if constexpr (O == Op::LOG) return logf(x);
  else if constexpr (O == Op::SIN) return sinf(x);
  else if constexpr (O == Op::COS) return cosf(x);
  else if constexpr (O == Op::POW) {
    // The exponents the CPU kernel special-cases, computed the same way.
    if (a == 1.0f) return x;
    if (a == 2.0f) return x * x;
    if (a == 3.0f) return x * x * x;
    if (a == 0.5f) return sqrtf(x);
    if (a == -1.0f) return 1.0f / x;
    if (a == 0.0f) return 1.0f;
    return powf(x, a);
  } else if constexpr (O == Op::SCALE) return fmaf(a, x, b);
  else if constexpr (O == Op::CLAMP) return x != x ? x : fminf(fmaxf(x, a), b);
  else if constexpr (O == Op::RELU) return x < 0.0f ? 0.0f : x;
  else if constexpr (O == Op::LEAKY_RELU) return x > 0.0f ? x : x * a;
  else if constexpr (O == Op::GELU) {
    const float u2 = 2.0f * 0.7978845608028654f * fmaf(0.044715f * x * x, x, x);
    return x * sigmoid(u2);
  } else if constexpr (O == Op::GELU_ERF) return 0.5f * x * erfcf(x * -0.70710678118654752f);
  else if constexpr (O == Op::ERF) return erff(x);
  else if constexpr (O == Op::SILU) return x * sigmoid(x);
  else if constexpr (O == Op::SIGMOID) return sigmoid(x);
  else if constexpr (O == Op::TANH) return tanhf(x);
  else if constexpr (O == Op::SOFTPLUS)
    return x != x ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
  else return x;
}

template <Op O>
__global__ void k_unary(char* d, Idx di, const char* s, Idx si, float a, float b, int64_t n) {
  KILN_GRID_LOOP(i, n) atf(d, di.off(i)) = unary<O>(ldf(s, si.off(i)), a, b);
}

template <Op O>
void launch_unary(TensorNode* dst, float a, float b, const Launch& L) {
  const int64_t n = dst->numel();
  k_unary<O><<<grid_for(n), kThreads, 0, L.stream>>>(static_cast<char*>(dst->data), idx_of(dst),
                                                     static_cast<const char*>(dst->src[0]->data),
                                                     bcast_idx(dst->src[0], dst->shape), a, b, n);
  check_launch(op_name(O));
}

// ------------------------------------------------------------------ optimizer steps
// hp: the step's values laid out as AdamWHyper / SgdHyper (kiln/op_params.h),
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

__global__ void k_gather_f32(const char* s, DType t, Idx si, int64_t n, float* out) {
  KILN_GRID_LOOP(i, n) out[i] = load_as_f32(s + si.off(i), t);
}

}  // namespace

void gather_f32(const char* src, DType t, const Idx& si, int64_t n, float* out, const Launch& L) {
  if (n == 0) return;
  k_gather_f32<<<grid_for(n), kThreads, 0, L.stream>>>(src, t, si, n, out);
  check_launch("gather_f32");
}

void copy_ops(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  char* d = static_cast<char*>(dst->data);
  switch (dst->op) {
    case Op::CPY: {
      const TensorNode* src = dst->src[0];
      // dst has src's shape (any strides) or is contiguous with another shape
      // (a copy feeding a reshape): elements go in src's row-major order.
      const Idx di =
          dst->shape == src->shape ? idx_of(dst) : dense_idx(src->shape, int64_t(dst->elem_size()));
      k_copy<<<grid_for(n), kThreads, 0, L.stream>>>(d, di, static_cast<const char*>(src->data),
                                                     idx_of(src), dst->dtype, src->dtype,
                                                     src->numel());
      return check_launch("copy");
    }
    case Op::FILL:
      k_fill<<<grid_for(n), kThreads, 0, L.stream>>>(
          d, idx_of(dst), fill_bits(dst->dtype, prm::fill_value(dst)), int(dst->elem_size()), n);
      return check_launch("full");
    case Op::RAND_MASK: {
      const int32_t* seed_t =
          dst->n_src > 0 && dst->src[0] ? static_cast<const int32_t*>(dst->src[0]->data) : nullptr;
      k_rand_mask<<<grid_for(n), kThreads, 0, L.stream>>>(d, idx_of(dst), prm::rand_seed(dst),
                                                          seed_t, prm::rand_p(dst), n);
      return check_launch("rand_mask");
    }
    default: fail("cuda", "copy_ops got ", op_name(dst->op));
  }
}

void binary_ops(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  char* d = static_cast<char*>(dst->data);
  const Shape& s = dst->shape;
  const TensorNode *a = dst->src[0], *b = dst->src[1];
  const char* ap = static_cast<const char*>(a->data);
  const char* bp = b ? static_cast<const char*>(b->data) : nullptr;
  const unsigned grid = grid_for(n);
  switch (dst->op) {
    case Op::ADD:
    case Op::ACCUMULATE:
      k_binary<kAdd><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::SUB:
      k_binary<kSub><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::MUL:
      k_binary<kMul><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::DIV:
      k_binary<kDiv><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::CMP:
      k_cmp<<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                             bcast_idx(b, s), prm::cmp_mode(dst),
                                             a->dtype == DType::i32, n);
      break;
    case Op::WHERE: {
      const TensorNode* y = dst->src[2];
      k_where<<<grid, kThreads, 0, L.stream>>>(
          d, idx_of(dst), ap, bcast_idx(a, s), a->dtype == DType::i32, bp, bcast_idx(b, s),
          static_cast<const char*>(y->data), bcast_idx(y, s), n);
      break;
    }
    default: fail("cuda", "binary_ops got ", op_name(dst->op));
  }
  check_launch(op_name(dst->op));
}

void unary_ops(TensorNode* dst, const Launch& L) {
  switch (dst->op) {
#define KILN_UNARY(E, A, B) \
  case Op::E: return launch_unary<Op::E>(dst, A, B, L);
    KILN_UNARY(NEG, 0, 0)
    KILN_UNARY(ABS, 0, 0)
    KILN_UNARY(SIGN, 0, 0)
    KILN_UNARY(SQR, 0, 0)
    KILN_UNARY(SQRT, 0, 0)
    KILN_UNARY(EXP, 0, 0)
    KILN_UNARY(LOG, 0, 0)
    KILN_UNARY(SIN, 0, 0)
    KILN_UNARY(COS, 0, 0)
    KILN_UNARY(POW, prm::pow_exp(dst), 0)
    KILN_UNARY(SCALE, prm::scale_mul(dst), prm::scale_add(dst))
    KILN_UNARY(CLAMP, prm::clamp_lo(dst), prm::clamp_hi(dst))
    KILN_UNARY(RELU, 0, 0)
    KILN_UNARY(LEAKY_RELU, prm::leaky_slope(dst), 0)
    KILN_UNARY(GELU, 0, 0)
    KILN_UNARY(GELU_ERF, 0, 0)
    KILN_UNARY(ERF, 0, 0)
    KILN_UNARY(SILU, 0, 0)
    KILN_UNARY(SIGMOID, 0, 0)
    KILN_UNARY(TANH, 0, 0)
    KILN_UNARY(SOFTPLUS, 0, 0)
#undef KILN_UNARY
    default: fail("cuda", "unary_ops got ", op_name(dst->op));
  }
}

void optim_ops(TensorNode* dst, const Launch& L) {
  TensorNode* p = dst->src[0];
  const TensorNode* g = dst->src[1];
  const int64_t n = p->numel();
  // dst aliases the param: read and write through src0's strides.
  char* pd = static_cast<char*>(dst->data);
  const char* gp = static_cast<const char*>(g->data);
  if (dst->op == Op::OPT_STEP_ADAMW) {
    TensorNode *m = dst->src[2], *v = dst->src[3];
    k_adamw<<<grid_for(n), kThreads, 0, L.stream>>>(
        pd, idx_of(p), gp, idx_of(g), static_cast<char*>(m->data), idx_of(m),
        static_cast<char*>(v->data), idx_of(v), hp_of(dst->src[4]), n);
    return check_launch("adamw_step");
  }
  if (dst->op == Op::OPT_STEP_SGD) {
    const bool has_buf = dst->n_src == 4;
    TensorNode* b = has_buf ? dst->src[2] : nullptr;
    k_sgd<<<grid_for(n), kThreads, 0, L.stream>>>(
        pd, idx_of(p), gp, idx_of(g), b ? static_cast<char*>(b->data) : nullptr,
        b ? idx_of(b) : Idx{}, hp_of(dst->src[dst->n_src - 1]), n);
    return check_launch("sgd_step");
  }
  fail("cuda", "optim_ops got ", op_name(dst->op));
}

}  // namespace kiln::cuda
