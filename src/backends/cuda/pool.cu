// Pooling: MAX_POOL2D (+ BACK), AVG_POOL2D (+ BACK). Inputs have any strides; dst
// is contiguous. The backward ops are gathers: each dst element sums its
// contributions itself in a fixed order (oh, ow ascending, the CPU's generic
// loops' order), so nothing races and no atomics are needed.
#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "backends/cuda/window.cuh"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// Row-major position (ih*W + iw) of the first maximum of window (oh, ow) of one
// plane; padding never wins, NaN wins (PyTorch). -1 for an empty window.
__device__ int64_t window_argmax(const char* plane, const Planes& x, const Geom& g, int64_t oh,
                                 int64_t ow, float* value) {
  float best = -INFINITY;
  int64_t arg = -1;
  const int64_t h0 = oh * g.win.sh - g.win.ph, w0 = ow * g.win.sw - g.win.pw;
  for (int64_t ih = max(h0, int64_t(0)); ih < min(h0 + g.win.kh, g.h); ++ih)
    for (int64_t iw = max(w0, int64_t(0)); iw < min(w0 + g.win.kw, g.w); ++iw) {
      const float v = ldf(plane, ih * x.sh + iw * x.sw);
      if (arg < 0 || v > best || (v != v && best == best)) {
        best = v;
        arg = ih * g.w + iw;
      }
    }
  *value = best;
  return arg;
}

template <bool kMax>
__global__ void k_pool(Planes x, Geom g, float* out, int64_t total) {
  const float inv = 1.0f / float(g.win.kh * g.win.kw);  // padding counts as zeros
  KILN_GRID_LOOP(i, total) {
    const int64_t ow = i % g.ow, oh = (i / g.ow) % g.oh, pl = i / g.p();
    const char* plane = x.p + (pl / g.c) * x.sn + (pl % g.c) * x.sc;
    if (kMax) {
      float v;
      window_argmax(plane, x, g, oh, ow, &v);
      out[i] = v;
    } else {
      const int64_t h0 = oh * g.win.sh - g.win.ph, w0 = ow * g.win.sw - g.win.pw;
      float s = 0.0f;
      for (int64_t ih = max(h0, int64_t(0)); ih < min(h0 + g.win.kh, g.h); ++ih)
        for (int64_t iw = max(w0, int64_t(0)); iw < min(w0 + g.win.kw, g.w); ++iw)
          s += ldf(plane, ih * x.sh + iw * x.sw);
      out[i] = s * inv;
    }
  }
}

// The output rows (cols) whose windows contain input row ih: [lo, hi].
__device__ inline void windows_over(int64_t i, int64_t pad, int64_t k, int64_t s, int64_t n_out,
                                    int64_t* lo, int64_t* hi) {
  const int64_t first = i + pad - k + 1;  // o*s >= first
  *lo = first <= 0 ? 0 : (first + s - 1) / s;
  *hi = min(n_out - 1, (i + pad) / s);
}

// dx[n, c, ih, iw] = sum over the windows containing it (oh, ow ascending) of
// g[oh, ow] where (ih, iw) is the window's first max (kMax), or g[oh, ow] / (KH*KW).
template <bool kMax>
__global__ void k_pool_back(Planes x, Planes gr, Geom g, float* dx, int64_t total) {
  const float inv = 1.0f / float(g.win.kh * g.win.kw);
  KILN_GRID_LOOP(i, total) {
    const int64_t iw = i % g.w, ih = (i / g.w) % g.h, pl = i / (g.w * g.h);
    const int64_t n = pl / g.c, c = pl % g.c;
    const char* gp = gr.p + n * gr.sn + c * gr.sc;
    const char* xp = kMax ? x.p + n * x.sn + c * x.sc : nullptr;
    int64_t oh0, oh1, ow0, ow1;
    windows_over(ih, g.win.ph, g.win.kh, g.win.sh, g.oh, &oh0, &oh1);
    windows_over(iw, g.win.pw, g.win.kw, g.win.sw, g.ow, &ow0, &ow1);
    float acc = 0.0f;
    for (int64_t oh = oh0; oh <= oh1; ++oh)
      for (int64_t ow = ow0; ow <= ow1; ++ow) {
        if (kMax) {
          float v;
          if (window_argmax(xp, x, g, oh, ow, &v) == ih * g.w + iw)
            acc += ldf(gp, oh * gr.sh + ow * gr.sw);
        } else {
          acc += ldf(gp, oh * gr.sh + ow * gr.sw) * inv;
        }
      }
    dx[i] = acc;
  }
}

}  // namespace

void pool_ops(TensorNode* dst, const Launch& L) {
  const int64_t total = dst->numel();
  if (total == 0) return;
  float* out = static_cast<float*>(dst->data);
  switch (dst->op) {
    case Op::MAX_POOL2D:
    case Op::AVG_POOL2D: {
      const TensorNode* x = dst->src[0];
      Geom g = geom(x->shape, prm::window(dst, false));
      g.oh = dst->shape[2];  // the builder's output size, as the CPU kernel
      g.ow = dst->shape[3];
      if (dst->op == Op::MAX_POOL2D)
        k_pool<true><<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), g, out, total);
      else k_pool<false><<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), g, out, total);
      return check_launch(op_name(dst->op));
    }
    case Op::MAX_POOL2D_BACK: {
      const TensorNode *x = dst->src[0], *gr = dst->src[1];
      Geom g = geom(dst->shape, prm::window(dst, false));
      g.oh = gr->shape[2];
      g.ow = gr->shape[3];
      k_pool_back<true>
          <<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), planes(gr), g, out, total);
      return check_launch("max_pool2d_back");
    }
    case Op::AVG_POOL2D_BACK: {
      const TensorNode* gr = dst->src[0];
      Geom g = geom(dst->shape, prm::window(dst, false));
      g.oh = gr->shape[2];
      g.ow = gr->shape[3];
      k_pool_back<false>
          <<<grid_for(total), kThreads, 0, L.stream>>>(Planes{}, planes(gr), g, out, total);
      return check_launch("avg_pool2d_back");
    }
    default: fail("cuda", "pool_ops got ", op_name(dst->op));
  }
}

OpKernel pool_kernel(Op op) {
  switch (op) {
    case Op::MAX_POOL2D:
    case Op::MAX_POOL2D_BACK:
    case Op::AVG_POOL2D:
    case Op::AVG_POOL2D_BACK: return {all_f32, pool_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
