// Convolution and pooling kernels: IM2COL, COL2IM, MAX_POOL2D (+ BACK),
// AVG_POOL2D (+ BACK). Inputs may have any strides; dst is contiguous.
// Gathers (IM2COL, pooling) split output rows between threads; scatters (COL2IM,
// the *_BACK ops) split whole (n, c) planes, each summed by one thread in a fixed
// order, so nothing races and results do not depend on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {

namespace {

// Thread t's items of [0, n), each costing about `cost` cheap operations; small
// jobs stay on fewer threads (common.h). Item values never depend on the split.
std::pair<int64_t, int64_t> items(const ThreadCtx& t, int64_t n, int64_t cost) {
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

// Row-major position (ih*W + iw) of the first maximum of the window at (oh, ow);
// padding is -inf and never wins (a window always holds at least one real
// element because padding <= kernel/2). NaN wins (and propagates) as in PyTorch.
int64_t window_argmax(const Planes& x, const char* plane, int64_t h, int64_t w,
                      const Window& win, int64_t oh, int64_t ow, float* value) {
  float best = -std::numeric_limits<float>::infinity();
  int64_t arg = -1;
  const int64_t h0 = oh * win.sh - win.ph, w0 = ow * win.sw - win.pw;
  for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + win.kh, h); ++ih) {
    for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + win.kw, w); ++iw) {
      const float v = ld(plane + ih * x.sh + iw * x.sw);
      if (arg < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
        best = v;
        arg = ih * w + iw;
      }
    }
  }
  *value = best;
  return arg;
}

}  // namespace

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

void kernel_MAX_POOL2D(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const Planes x(src);
  const Window win(dst->p, false);
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = dst->shape[2], ow_n = dst->shape[3];
  const auto [r0, r1] = items(t, dst->shape[0] * c_in * oh_n, ow_n * win.kh * win.kw);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t pl = r / oh_n, oh = r % oh_n;
    const char* plane = x.plane(pl / c_in, pl % c_in);
    float* d = static_cast<float*>(dst->data) + r * ow_n;
    for (int64_t ow = 0; ow < ow_n; ++ow) window_argmax(x, plane, h, w, win, oh, ow, &d[ow]);
  }
}

void kernel_MAX_POOL2D_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const TensorNode* gsrc = dst->src[1];
  const Planes x(src), g(gsrc);
  const Window win(dst->p, false);
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = gsrc->shape[2], ow_n = gsrc->shape[3];
  const auto [p0, p1] = items(t, dst->shape[0] * c_in, oh_n * ow_n * win.kh * win.kw);
  for (int64_t pl = p0; pl < p1; ++pl) {
    const int64_t n = pl / c_in, c = pl % c_in;
    float* d = static_cast<float*>(dst->data) + pl * h * w;
    std::fill(d, d + h * w, 0.0f);
    const char* xp = x.plane(n, c);
    const char* gp = g.plane(n, c);
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        float v;
        const int64_t arg = window_argmax(x, xp, h, w, win, oh, ow, &v);
        if (arg >= 0) d[arg] += ld(gp + oh * g.sh + ow * g.sw);
      }
    }
  }
}

void kernel_AVG_POOL2D(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const Planes x(src);
  const Window win(dst->p, false);
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = dst->shape[2], ow_n = dst->shape[3];
  const float inv = 1.0f / float(win.kh * win.kw);  // padding counts as zeros
  const auto [r0, r1] = items(t, dst->shape[0] * c_in * oh_n, ow_n * win.kh * win.kw);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t pl = r / oh_n, oh = r % oh_n;
    const char* plane = x.plane(pl / c_in, pl % c_in);
    float* d = static_cast<float*>(dst->data) + r * ow_n;
    const int64_t h0 = oh * win.sh - win.ph;
    const int64_t ih0 = std::max<int64_t>(h0, 0), ih1 = std::min(h0 + win.kh, h);
    for (int64_t ow = 0; ow < ow_n; ++ow) {
      const int64_t w0 = ow * win.sw - win.pw;
      const int64_t iw0 = std::max<int64_t>(w0, 0), iw1 = std::min(w0 + win.kw, w);
      float s = 0.0f;
      for (int64_t ih = ih0; ih < ih1; ++ih) {
        const char* row = plane + ih * x.sh;
        for (int64_t iw = iw0; iw < iw1; ++iw) s += ld(row + iw * x.sw);
      }
      d[ow] = s * inv;
    }
  }
}

void kernel_AVG_POOL2D_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* gsrc = dst->src[0];
  const Planes g(gsrc);
  const Window win(dst->p, false);
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = gsrc->shape[2], ow_n = gsrc->shape[3];
  const float inv = 1.0f / float(win.kh * win.kw);
  const auto [p0, p1] = items(t, dst->shape[0] * c_in, oh_n * ow_n * win.kh * win.kw);
  for (int64_t pl = p0; pl < p1; ++pl) {
    float* d = static_cast<float*>(dst->data) + pl * h * w;
    std::fill(d, d + h * w, 0.0f);
    const char* gp = g.plane(pl / c_in, pl % c_in);
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      const int64_t h0 = oh * win.sh - win.ph;
      const int64_t ih0 = std::max<int64_t>(h0, 0), ih1 = std::min(h0 + win.kh, h);
      for (int64_t ow = 0; ow < ow_n; ++ow) {
        const float v = ld(gp + oh * g.sh + ow * g.sw) * inv;
        const int64_t w0 = ow * win.sw - win.pw;
        const int64_t iw0 = std::max<int64_t>(w0, 0), iw1 = std::min(w0 + win.kw, w);
        for (int64_t ih = ih0; ih < ih1; ++ih)
          for (int64_t iw = iw0; iw < iw1; ++iw) d[ih * w + iw] += v;
      }
    }
  }
}

}  // namespace kiln::cpu
