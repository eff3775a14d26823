// The window geometry shared by the convolution (conv.cu) and pooling (pool.cu)
// kernels: sizes of a [N, C, H, W] input and its output, and the byte strides of
// a strided [N, C, H, W] tensor.
#pragma once
#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"

namespace kiln::cuda {

using prm::Window;

struct Geom {
  int64_t n, c, h, w, oh, ow;
  Window win;
  __host__ __device__ int64_t p() const { return oh * ow; }
  __host__ __device__ int64_t kk() const { return win.kh * win.kw; }
  __host__ __device__ int64_t ckk() const { return c * kk(); }
};

inline int64_t out_h(const Window& w, int64_t h) {
  return (h + 2 * w.ph - w.dh * (w.kh - 1) - 1) / w.sh + 1;
}
inline int64_t out_w(const Window& w, int64_t x) {
  return (x + 2 * w.pw - w.dw * (w.kw - 1) - 1) / w.sw + 1;
}

inline Geom geom(const Shape& x, const Window& win) {
  return {x[0], x[1], x[2], x[3], out_h(win, x[2]), out_w(win, x[3]), win};
}

struct Planes {  // byte strides of a strided [N, C, H, W] tensor
  const char* p;
  int64_t sn, sc, sh, sw;
};
inline Planes planes(const TensorNode* t) {
  return {static_cast<const char*>(t->data), t->stride[0], t->stride[1], t->stride[2],
          t->stride[3]};
}

}  // namespace kiln::cuda
