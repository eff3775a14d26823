// Pooling kernels: MAX_POOL2D (+ BACK), AVG_POOL2D (+ BACK). Inputs may have any
// strides; dst is contiguous. Gathers split output rows between threads;
// scatters (the *_BACK ops) split whole (n, c) planes, each summed by one thread
// in a fixed order, so nothing races and results do not depend on the thread count.
//
// The common CNN case, 2x2 windows with stride 2 and no padding over rows that
// are contiguous along W, has a vector path (pool_k2.h): the windows do not
// overlap, so the backward ops write every dst element once instead of zeroing
// and scattering. It gives the same floats as the generic loops, bit for bit:
// the same additions in the same order, and window_argmax's rule restated for
// vectors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/pool_k2.h"
#include "backends/cpu/kernels/window.h"

namespace kiln::cpu {

using namespace window;

namespace {

// Row-major position (ih*W + iw) of the first maximum of the window at (oh, ow);
// padding is -inf and never wins (a window always holds at least one real
// element because padding <= kernel/2). NaN wins (and propagates) as in PyTorch.
int64_t window_argmax(const Planes& x, const char* plane, int64_t h, int64_t w, const Window& win,
                      int64_t oh, int64_t ow, float* value) {
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

void kernel_MAX_POOL2D(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const Planes x(src);
  const Window win(op_params<Pool2dParams>(*dst));
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = dst->shape[2], ow_n = dst->shape[3];
  const auto rows = items(t, dst->shape[0] * c_in * oh_n, ow_n * win.kh * win.kw);
  float* out = static_cast<float*>(dst->data);
  if (pool_k2::applies(win, x, h, w, oh_n, ow_n))
    return pool_k2::gather_rows(pool_k2::Input(src), oh_n, ow_n, out, rows,
                                [](const pool_k2::Quad& q) { return pool_k2::first_max(q); });
  for (int64_t r = rows.first; r < rows.second; ++r) {
    const int64_t pl = r / oh_n, oh = r % oh_n;
    const char* plane = x.plane(pl / c_in, pl % c_in);
    float* d = out + r * ow_n;
    for (int64_t ow = 0; ow < ow_n; ++ow) window_argmax(x, plane, h, w, win, oh, ow, &d[ow]);
  }
}

void kernel_MAX_POOL2D_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const TensorNode* gsrc = dst->src[1];
  const Planes x(src), g(gsrc);
  const Window win(op_params<Pool2dParams>(*dst));
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = gsrc->shape[2], ow_n = gsrc->shape[3];
  const auto planes = items(t, dst->shape[0] * c_in, oh_n * ow_n * win.kh * win.kw);
  float* out = static_cast<float*>(dst->data);
  if (pool_k2::applies(win, x, h, w, oh_n, ow_n) && g.sw == 4) {
    const pool_k2::Input xin(src), gin(gsrc);
    return pool_k2::write_planes(out, h, w, oh_n, ow_n, planes, [&](int64_t pl) {
      return [xp = xin.plane(pl), gp = gin.plane(pl)](int64_t oh, int64_t ow, int m) {
        return pool_k2::route_to_max(xp.quad(oh, ow, m), pool_k2::plus0(gp.chunk(oh, ow, m)));
      };
    });
  }
  for (int64_t pl = planes.first; pl < planes.second; ++pl) {
    const int64_t n = pl / c_in, c = pl % c_in;
    float* d = out + pl * h * w;
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
  const Window win(op_params<Pool2dParams>(*dst));
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = dst->shape[2], ow_n = dst->shape[3];
  const float inv = 1.0f / float(win.kh * win.kw);  // padding counts as zeros
  const auto rows = items(t, dst->shape[0] * c_in * oh_n, ow_n * win.kh * win.kw);
  float* out = static_cast<float*>(dst->data);
  if (pool_k2::applies(win, x, h, w, oh_n, ow_n)) {
    const vm::VF vinv = vm::c<vm::VF>(inv);
    return pool_k2::gather_rows(pool_k2::Input(src), oh_n, ow_n, out, rows,
                                [&](const pool_k2::Quad& q) { return pool_k2::sum(q) * vinv; });
  }
  for (int64_t r = rows.first; r < rows.second; ++r) {
    const int64_t pl = r / oh_n, oh = r % oh_n;
    const char* plane = x.plane(pl / c_in, pl % c_in);
    float* d = out + r * ow_n;
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
  const Window win(op_params<Pool2dParams>(*dst));
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = gsrc->shape[2], ow_n = gsrc->shape[3];
  const float inv = 1.0f / float(win.kh * win.kw);
  const auto planes = items(t, dst->shape[0] * c_in, oh_n * ow_n * win.kh * win.kw);
  float* out = static_cast<float*>(dst->data);
  if (pool_k2::applies(win, g, h, w, oh_n, ow_n)) {
    const vm::VF vinv = vm::c<vm::VF>(inv);
    const pool_k2::Input gin(gsrc);
    return pool_k2::write_planes(out, h, w, oh_n, ow_n, planes, [&](int64_t pl) {
      return [gp = gin.plane(pl), vinv](int64_t oh, int64_t ow, int m) {
        const vm::VF v = pool_k2::plus0_product(gp.chunk(oh, ow, m) * vinv);
        return pool_k2::Quad{v, v, v, v};
      };
    });
  }
  for (int64_t pl = planes.first; pl < planes.second; ++pl) {
    float* d = out + pl * h * w;
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
