// Shared geometry of the window ops (IM2COL, COL2IM, pooling): the window
// parameters, strided NCHW planes and the per-thread split of items.
#pragma once

#include <algorithm>
#include <cstring>
#include <utility>

#include "backends/cpu/kernels/common.h"

namespace kiln::cpu::window {

// Thread t's items of [0, n), each costing about `cost` cheap operations; small
// jobs stay on fewer threads (common.h). Item values never depend on the split.
inline std::pair<int64_t, int64_t> items(const ThreadCtx& t, int64_t n, int64_t cost) {
  const Range r = thread_range(t, n, std::max<int64_t>(cost, 1), 1);
  return {r.begin, std::max(r.begin, r.end)};
}

inline float ld(const char* p) {
  float v;
  std::memcpy(&v, p, 4);
  return v;
}

// Window geometry from the op params (pooling has dilation 1).
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  explicit Window(const Conv2dParams& p)
      : kh(p.kh), kw(p.kw), sh(p.sh), sw(p.sw), ph(p.ph), pw(p.pw), dh(p.dh), dw(p.dw) {}
  explicit Window(const Pool2dParams& p)
      : kh(p.kh), kw(p.kw), sh(p.sh), sw(p.sw), ph(p.ph), pw(p.pw) {}
  int64_t out_h(int64_t h) const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w(int64_t w) const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// A strided [N, C, H, W] f32 tensor.
struct Planes {
  const char* data;
  int64_t sn, sc, sh, sw;
  explicit Planes(const TensorNode* t)
      : data(static_cast<const char*>(t->data)),
        sn(t->stride[0]),
        sc(t->stride[1]),
        sh(t->stride[2]),
        sw(t->stride[3]) {}
  const char* plane(int64_t n, int64_t c) const { return data + n * sn + c * sc; }
};

// Columns of one image (conv.cpp). Row (c, kh, kw) of the [C*KH*KW, OH*OW]
// columns from plane c (byte strides sh_b, sw_b): d[oh*OW + ow] = x(ih, iw), 0 in
// the padding.
void im2col_row(const char* plane, int64_t sh_b, int64_t sw_b, int64_t h, int64_t w,
                const Window& win, int64_t kh, int64_t kw, int64_t oh_n, int64_t ow_n, float* d);
// The adjoint for one plane: d [h, w] (contiguous) = the sum of the KH*KW column
// rows of plane c, row (kh, kw) at rows + (kh*KW + kw)*s1 bytes, elements s2 apart.
void col2im_plane(const char* rows, int64_t s1, int64_t s2, int64_t h, int64_t w, const Window& win,
                  int64_t oh_n, int64_t ow_n, float* d);

}  // namespace kiln::cpu::window
