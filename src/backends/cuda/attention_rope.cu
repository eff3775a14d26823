// ROPE and ROPE_BACK: one thread per pair (i, i + D/2) of a row (b, t, h) of x
// [B, T, H, D], tables [T, D] (or [B, T, D] per sequence) with any strides. A
// thread reads both elements of its pair before writing them, so in place is safe.
#include "backends/cuda/common.cuh"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

struct RopeGeom {
  int64_t T, H, half;
  int64_t xs[kMaxDims];  // x's byte strides
  int64_t cs[2], ss[2];  // the tables' byte strides (position, column)
  int64_t cb, sb;        // their batch strides: [B, T, D] tables; 0 for [T, D]
};

template <bool kBack>
__global__ void k_rope(const char* x, const char* cos, const char* sin, RopeGeom g, int64_t pairs,
                       float* out) {
  KILN_GRID_LOOP(k, pairs) {
    const int64_t i = k % g.half, row = k / g.half;
    const int64_t hh = row % g.H, t = row / g.H % g.T, b = row / (g.H * g.T);
    const int64_t xo = b * g.xs[0] + t * g.xs[1] + hh * g.xs[2];
    const float lo = ldf(x, xo + i * g.xs[3]), hi = ldf(x, xo + (i + g.half) * g.xs[3]);
    const int64_t co = b * g.cb + t * g.cs[0], so = b * g.sb + t * g.ss[0];
    const float c0 = ldf(cos, co + i * g.cs[1]);
    const float c1 = ldf(cos, co + (i + g.half) * g.cs[1]);
    const float s0 = ldf(sin, so + i * g.ss[1]);
    const float s1 = ldf(sin, so + (i + g.half) * g.ss[1]);
    float* y = out + row * 2 * g.half;
    if (kBack) {
      y[i] = lo * c0 + hi * s1;
      y[i + g.half] = hi * c1 - lo * s0;
    } else {
      y[i] = lo * c0 - hi * s0;
      y[i + g.half] = hi * c1 + lo * s1;
    }
  }
}

void rope_ops(TensorNode* dst, const Launch& L) {
  const TensorNode* x = dst->src[0];
  const TensorNode* c = dst->src[1];
  const TensorNode* s = dst->src[2];
  RopeGeom g{};
  g.T = x->shape[1];
  g.H = x->shape[2];
  g.half = x->shape[3] / 2;
  for (int d = 0; d < 4; ++d) g.xs[d] = x->stride[size_t(d)];
  const int td = c->shape.ndim() - 2;  // [B, T, D] tables (per sequence): 1
  for (int d = 0; d < 2; ++d) {
    g.cs[d] = c->stride[size_t(td + d)];
    g.ss[d] = s->stride[size_t(td + d)];
  }
  g.cb = td ? c->stride[0] : 0;
  g.sb = td ? s->stride[0] : 0;
  const int64_t pairs = x->numel() / 2;
  if (pairs == 0) return;
  const char* xp = static_cast<const char*>(x->data);
  const char* cp = static_cast<const char*>(c->data);
  const char* sp = static_cast<const char*>(s->data);
  float* out = static_cast<float*>(dst->data);
  if (dst->op == Op::ROPE)
    k_rope<false><<<grid_for(pairs), kThreads, 0, L.stream>>>(xp, cp, sp, g, pairs, out);
  else k_rope<true><<<grid_for(pairs), kThreads, 0, L.stream>>>(xp, cp, sp, g, pairs, out);
  check_launch(op_name(dst->op));
}

}  // namespace

OpKernel rope_kernel(Op op) {
  if (op == Op::ROPE || op == Op::ROPE_BACK) return {all_f32, rope_ops};
  return {};
}

}  // namespace kiln::cuda
