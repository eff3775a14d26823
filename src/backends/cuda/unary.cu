// Unary math: NEG .. SOFTPLUS, one Unary<Op> specialisation per op, and GELU's
// fused gradients (UnaryBack<Op>: dy * f'(x)) (the math
// follows the CPU kernels' definitions: NaN rules of sign, clamp, relu,
// softplus; the stable sigmoid; gelu's tanh form as x * sigmoid(2u); libdevice's
// expf/logf/tanhf/erff are within a few ulp).
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

__device__ inline float sigmoid(float x) {
  const float e = expf(-fabsf(x));
  const float s = 1.0f / (1.0f + e);
  return x >= 0.0f ? s : e * s;
}

// One specialisation per unary op of ops.def that has a CUDA kernel: f is the
// math (x, and the op's parameters a, b read on the host by args). An op of the
// family without one is not supported: the scheduler runs it on another backend.
template <Op O>
struct Unary;

struct NoArgs {
  static float2 args(const TensorNode*) { return {0.0f, 0.0f}; }
};

#define KILN_CUDA_UNARY(E, expr)                                            \
  template <>                                                               \
  struct Unary<Op::E> : NoArgs {                                            \
    __device__ static float f(float x, float a, float b) { return (expr); } \
  };

KILN_CUDA_UNARY(NEG, -x)
KILN_CUDA_UNARY(ABS, fabsf(x))
KILN_CUDA_UNARY(SIGN, x > 0.0f ? 1.0f : x < 0.0f ? -1.0f : 0.0f)  // NaN: 0 (torch)
KILN_CUDA_UNARY(SQR, x* x)
KILN_CUDA_UNARY(SQRT, sqrtf(x))
KILN_CUDA_UNARY(RSQRT, 1.0f / sqrtf(x))  // as the CPU kernel, not the approximate rsqrtf
KILN_CUDA_UNARY(EXP, expf(x))
KILN_CUDA_UNARY(LOG, logf(x))
KILN_CUDA_UNARY(SIN, sinf(x))
KILN_CUDA_UNARY(COS, cosf(x))
KILN_CUDA_UNARY(RELU, x < 0.0f ? 0.0f : x)
KILN_CUDA_UNARY(GELU_ERF, 0.5f * x * erfcf(x * -0.70710678118654752f))
KILN_CUDA_UNARY(ERF, erff(x))
KILN_CUDA_UNARY(SILU, x* sigmoid(x))
KILN_CUDA_UNARY(SIGMOID, sigmoid(x))
KILN_CUDA_UNARY(TANH, tanhf(x))
KILN_CUDA_UNARY(SOFTPLUS, x != x ? x : fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x))))
#undef KILN_CUDA_UNARY

template <>
struct Unary<Op::POW> {
  static float2 args(const TensorNode* n) { return {prm::pow_exp(n), 0.0f}; }
  // The exponents the CPU kernel special-cases, computed the same way.
  __device__ static float f(float x, float a, float) {
    if (a == 1.0f) return x;
    if (a == 2.0f) return x * x;
    if (a == 3.0f) return x * x * x;
    if (a == 0.5f) return sqrtf(x);
    if (a == -1.0f) return 1.0f / x;
    if (a == 0.0f) return 1.0f;
    return powf(x, a);
  }
};
template <>
struct Unary<Op::SCALE> {
  static float2 args(const TensorNode* n) { return {prm::scale_mul(n), prm::scale_add(n)}; }
  __device__ static float f(float x, float a, float b) { return fmaf(a, x, b); }
};
template <>
struct Unary<Op::CLAMP> {
  static float2 args(const TensorNode* n) { return {prm::clamp_lo(n), prm::clamp_hi(n)}; }
  __device__ static float f(float x, float a, float b) {
    return x != x ? x : fminf(fmaxf(x, a), b);
  }
};
template <>
struct Unary<Op::LEAKY_RELU> {
  static float2 args(const TensorNode* n) { return {prm::leaky_slope(n), 0.0f}; }
  __device__ static float f(float x, float a, float) { return x > 0.0f ? x : x * a; }
};
template <>
struct Unary<Op::GELU> : NoArgs {
  __device__ static float f(float x, float, float) {
    const float u2 = 2.0f * 0.7978845608028654f * fmaf(0.044715f * x * x, x, x);
    return x * sigmoid(u2);
  }
};

// The fused gradients GELU_BACK and GELU_ERF_BACK: dy * f'(x), as the CPU's
// vm::gelu_tanh_grad / vm::gelu_erf_grad (s(1-s) as e/(1+e)^2, no cancellation).
template <Op O>
struct UnaryBack;
template <>
struct UnaryBack<Op::GELU_BACK> {
  __device__ static float df(float x) {
    const float k2c = 2.0f * 0.7978845608028654f;
    const float x2 = x * x;
    const float u2 = k2c * fmaf(0.044715f * x2, x, x);
    const float e = expf(-fabsf(u2));
    const float r = 1.0f / (1.0f + e);
    const float s = u2 >= 0.0f ? r : e * r;
    const float ds = e * r * r;
    const float du2 = k2c * fmaf(3.0f * 0.044715f, x2, 1.0f);
    return s + (ds > 0.0f ? x * du2 * ds : 0.0f);
  }
};
template <>
struct UnaryBack<Op::GELU_ERF_BACK> {
  __device__ static float df(float x) {
    const float cdf = 0.5f * erfcf(x * -0.70710678118654752f);
    const float pdf = expf(x * x * -0.5f);
    return pdf > 0.0f ? fmaf(x * 0.3989422804014327f, pdf, cdf) : cdf;
  }
};

// Does op O have a Unary specialisation (a complete type)?
template <Op O>
constexpr bool has_unary = requires {
  sizeof(Unary<O>);
};

template <Op O>
constexpr bool has_unary_back = requires {
  sizeof(UnaryBack<O>);
};

// x of GELU and its gradients may be bf16 (Graph::bf16_gelu_inputs gives the
// CPU such nodes; a graph may hold them anywhere): widened exactly.
__device__ inline float ldx(const char* base, int64_t off, bool x16) {
  return x16 ? from_bf16(*reinterpret_cast<const uint16_t*>(base + off)) : ldf(base, off);
}
bool gelu_op(Op op) {
  return op == Op::GELU || op == Op::GELU_ERF || op == Op::GELU_BACK || op == Op::GELU_ERF_BACK;
}
// GELU's ops: f32 but for x (src0 forward, src1 backward), f32 or bf16.
bool gelu_dtypes(const TensorNode* n) {
  const int xi = n->op == Op::GELU || n->op == Op::GELU_ERF ? 0 : 1;
  if (n->dtype != DType::f32) return false;
  for (int i = 0; i < n->n_src; ++i) {
    const DType t = n->src[i]->dtype;
    if (t != DType::f32 && !(i == xi && t == DType::bf16)) return false;
  }
  return true;
}

template <Op O>
__global__ void k_unary(char* d, Idx di, const char* s, Idx si, bool x16, float a, float b,
                        int64_t n) {
  KILN_GRID_LOOP(i, n) atf(d, di.off(i)) = Unary<O>::f(ldx(s, si.off(i), x16), a, b);
}

template <Op O>
void launch_unary(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  const float2 ab = Unary<O>::args(dst);
  k_unary<O><<<grid_for(n), kThreads, 0, L.stream>>>(
      static_cast<char*>(dst->data), idx_of(dst), static_cast<const char*>(dst->src[0]->data),
      bcast_idx(dst->src[0], dst->shape), dst->src[0]->dtype == DType::bf16, ab.x, ab.y, n);
  check_launch(op_name(O));
}

// src0 dy, src1 x.
template <Op O>
__global__ void k_unary_back(char* d, Idx di, const char* g, Idx gi, const char* s, Idx si,
                             bool x16, int64_t n) {
  KILN_GRID_LOOP(i, n)
  atf(d, di.off(i)) = ldf(g, gi.off(i)) * UnaryBack<O>::df(ldx(s, si.off(i), x16));
}

template <Op O>
void launch_unary_back(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  const TensorNode *dy = dst->src[0], *x = dst->src[1];
  k_unary_back<O><<<grid_for(n), kThreads, 0, L.stream>>>(
      static_cast<char*>(dst->data), idx_of(dst), static_cast<const char*>(dy->data),
      bcast_idx(dy, dst->shape), static_cast<const char*>(x->data), bcast_idx(x, dst->shape),
      x->dtype == DType::bf16, n);
  check_launch(op_name(O));
}

}  // namespace

// The entries of the ops with a Unary specialisation, generated from ops.def.
OpKernel unary_kernel(Op op) {
  switch (op) {
#define KILN_OP(e, family, kind, inplace, grad)                                  \
  case Op::e:                                                                    \
    if constexpr (has_unary<Op::e>)                                              \
      return {gelu_op(Op::e) ? gelu_dtypes : all_f32, launch_unary<Op::e>};      \
    if constexpr (has_unary_back<Op::e>)                                         \
      return {gelu_op(Op::e) ? gelu_dtypes : all_f32, launch_unary_back<Op::e>}; \
    return {};
#include "kiln/ops.def"
#undef KILN_OP
    case Op::COUNT: break;
  }
  return {};
}

}  // namespace kiln::cuda
