// Convolution kernels: IM2COL and COL2IM. Inputs may have any strides; dst is
// contiguous. IM2COL splits output rows between threads; COL2IM splits whole
// (n, c) planes, each summed by one thread in a fixed order, so nothing races
// and results do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/window.h"

namespace kiln::cpu {

using namespace window;

void kernel_IM2COL(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const Planes x(src);
  const Window win(dst->p, true);
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = win.out_h(h), ow_n = win.out_w(w);
  const int64_t ckk = c_in * win.kh * win.kw, rows = dst->shape[0] * oh_n * ow_n;
  const auto [r0, r1] = items(t, rows, ckk);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / (oh_n * ow_n), oh = (r / ow_n) % oh_n, ow = r % ow_n;
    float* d = static_cast<float*>(dst->data) + r * ckk;
    int64_t k0, k1;
    win.valid_kw(ow, w, &k0, &k1);
    const int64_t iw0 = ow * win.sw - win.pw + k0 * win.dw;
    const bool unit = win.dw == 1 && x.sw == int64_t(sizeof(float));
    for (int64_t c = 0; c < c_in; ++c) {
      const char* plane = x.plane(n, c);
      for (int64_t kh = 0; kh < win.kh; ++kh) {
        const int64_t ih = oh * win.sh - win.ph + kh * win.dh;
        float* dk = d + (c * win.kh + kh) * win.kw;
        if (ih < 0 || ih >= h) {
          std::fill(dk, dk + win.kw, 0.0f);
          continue;
        }
        std::fill(dk, dk + k0, 0.0f);
        std::fill(dk + k1, dk + win.kw, 0.0f);
        if (k0 == k1) continue;
        const char* row = plane + ih * x.sh + iw0 * x.sw;
        if (unit) {
          std::memcpy(dk + k0, row, size_t(k1 - k0) * sizeof(float));
        } else {
          for (int64_t kw = k0; kw < k1; ++kw) dk[kw] = ld(row + (kw - k0) * win.dw * x.sw);
        }
      }
    }
  }
}

void kernel_COL2IM(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* cols = dst->src[0];
  const Window win(dst->p, true);
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = win.out_h(h), ow_n = win.out_w(w);
  const int64_t s0 = cols->stride[0], s1 = cols->stride[1], s2 = cols->stride[2];
  const auto [p0, p1] = items(t, dst->shape[0] * c_in, oh_n * ow_n * win.kh * win.kw);
  for (int64_t pl = p0; pl < p1; ++pl) {
    const int64_t n = pl / c_in, c = pl % c_in;
    float* d = static_cast<float*>(dst->data) + pl * h * w;
    std::fill(d, d + h * w, 0.0f);
    const char* base = static_cast<const char*>(cols->data) + n * s0;
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const char* row = base + (oh * ow_n + ow) * s1 + c * win.kh * win.kw * s2;
        int64_t k0, k1;
        win.valid_kw(ow, w, &k0, &k1);
        const int64_t iw0 = ow * win.sw - win.pw;
        for (int64_t kh = 0; kh < win.kh; ++kh) {
          const int64_t ih = oh * win.sh - win.ph + kh * win.dh;
          if (ih < 0 || ih >= h) continue;
          const int64_t o = ih * w + iw0;  // may be < 0; only o + kw*dw is in range
          const char* src = row + kh * win.kw * s2;
          for (int64_t kw = k0; kw < k1; ++kw) d[o + kw * win.dw] += ld(src + kw * s2);
        }
      }
    }
  }
}

}  // namespace kiln::cpu
