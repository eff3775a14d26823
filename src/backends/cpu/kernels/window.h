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

// Window geometry from the op params (pooling uses entries 0..5, dilation 1).
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
  explicit Window(const OpParams& p, bool dilated)
      : kh(p.i[0]), kw(p.i[1]), sh(p.i[2]), sw(p.i[3]), ph(p.i[4]), pw(p.i[5]) {
    if (dilated) {
      dh = p.i[6];
      dw = p.i[7];
    }
  }
  // Kernel columns [*k0, *k1) whose input column lies inside [0, w) for output
  // column ow (the rest read padding).
  void valid_kw(int64_t ow, int64_t w, int64_t* k0, int64_t* k1) const {
    const int64_t base = ow * sw - pw;  // iw = base + kw*dw
    *k0 = base >= 0 ? 0 : (-base + dw - 1) / dw;
    *k1 = base >= w ? 0 : std::min(kw, (w - base + dw - 1) / dw);
    if (*k1 < *k0) *k1 = *k0;
  }
  int64_t out_h(int64_t h) const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t out_w(int64_t w) const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
};

// A strided [N, C, H, W] f32 tensor.
struct Planes {
  const char* data;
  int64_t sn, sc, sh, sw;
  explicit Planes(const TensorNode* t)
      : data(static_cast<const char*>(t->data)),
        sn(t->stride[0]), sc(t->stride[1]), sh(t->stride[2]), sw(t->stride[3]) {}
  const char* plane(int64_t n, int64_t c) const { return data + n * sn + c * sc; }
};

}  // namespace kiln::cpu::window
