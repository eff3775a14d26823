// Convolution kernels: IM2COL and COL2IM in the [N, C*KH*KW, OH*OW] column layout
// (ops.def). Inputs may have any strides; dst is contiguous. Each column row
// (n, c, kh, kw) is the input plane shifted by (kh, kw): per output row oh it is
// one run of OW values, a plain copy (or add, for COL2IM) when the stride along
// W is 1, with zero padding at the ends. IM2COL splits column rows between
// threads; COL2IM splits whole (n, c) planes, each summed by one thread in a
// fixed order, so nothing races and results do not depend on the thread count.
#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/window.h"

#include "backends/cpu/kernels/simd.h"

namespace kiln::cpu {

using namespace window;

namespace {

// Output columns [ow0, ow1) whose input column iw = ow*sw + off lies in [0, w).
void valid_ow(int64_t off, int64_t sw, int64_t w, int64_t ow_n, int64_t* ow0, int64_t* ow1) {
  *ow0 = off >= 0 ? 0 : std::min(ow_n, (-off + sw - 1) / sw);
  *ow1 = off >= w ? 0 : std::min(ow_n, (w - off + sw - 1) / sw);
  if (*ow1 < *ow0) *ow1 = *ow0;
}

}  // namespace

namespace window {

#if defined(__AVX512F__)

// Lanes l of a 16-wide chunk starting at output column j with j + l in [lo, hi).
inline __mmask16 run_mask(int64_t j, int64_t lo, int64_t hi) {
  auto below = [](int64_t n) { return vm::tail_mask(int(std::clamp<int64_t>(n, 0, 16))); };
  return __mmask16(below(hi - j) & ~below(lo - j));
}

#endif

namespace {

// im2col_row for stride 1 along both dims, a contiguous plane and OW == W
// ("same" padding): the row is the plane shifted by one offset, so the
// in-image rows are one contiguous copy; then the columns that wrapped around
// into the neighbouring image row are zeroed.
void im2col_row_shifted(const float* plane, int64_t h, int64_t w, const Window& win, int64_t kh,
                        int64_t off, int64_t oh_n, float* d) {
  const int64_t dy = kh * win.dh - win.ph;  // ih = oh + dy
  const int64_t lo = std::clamp<int64_t>(-dy, 0, oh_n) * w;
  const int64_t hi = std::max(lo, std::clamp<int64_t>(h - dy, 0, oh_n) * w);
  const int64_t shift = dy * w + off;  // d[j] = plane[j + shift] for j in [lo, hi)
  const int64_t c0 = std::clamp(-shift, lo, hi), c1 = std::clamp(h * w - shift, c0, hi);
  std::fill(d, d + c0, 0.0f);
  std::memcpy(d + c0, plane + c0 + shift, size_t(c1 - c0) * sizeof(float));
  std::fill(d + c1, d + oh_n * w, 0.0f);
  if (off == 0) return;
  const int64_t z0 = off < 0 ? 0 : w - off, z1 = off < 0 ? -off : w;  // wrapped columns
  for (int64_t j = lo; j < hi; j += w)
    for (int64_t i = std::max<int64_t>(z0, 0); i < std::min(z1, w); ++i) d[j + i] = 0.0f;
}

}  // namespace

void im2col_row(const char* plane, int64_t sh_b, int64_t sw_b, int64_t h, int64_t w,
                const Window& win, int64_t kh, int64_t kw, int64_t oh_n, int64_t ow_n, float* d) {
  const bool unit = win.sw == 1 && sw_b == int64_t(sizeof(float));
  const int64_t off = kw * win.dw - win.pw;  // iw = ow*sw + off
  if (unit && win.sh == 1 && ow_n == w && sh_b == w * int64_t(sizeof(float)))
    return im2col_row_shifted(reinterpret_cast<const float*>(plane), h, w, win, kh, off, oh_n, d);
  int64_t ow0, ow1;
  valid_ow(off, win.sw, w, ow_n, &ow0, &ow1);
  // Runs are short (OW values): masked vector loads or plain loops, no
  // memcpy/fill calls (which cost more than the copy).
  for (int64_t oh = 0; oh < oh_n; ++oh, d += ow_n) {
    const int64_t ih = oh * win.sh - win.ph + kh * win.dh;
    const bool inside = ih >= 0 && ih < h;
#if defined(__AVX512F__)
    if (unit) {
      // One masked load per 16 outputs: lanes outside [ow0, ow1) (the padding)
      // are neither read nor left unwritten, they become 0.
      const float* src = inside ? reinterpret_cast<const float*>(plane + ih * sh_b) + off : nullptr;
      for (int64_t j = 0; j < ow_n; j += 16) {
        const __mmask16 out = run_mask(j, 0, ow_n);
        const __m512 v =
            inside ? _mm512_maskz_loadu_ps(run_mask(j, ow0, ow1), src + j) : _mm512_setzero_ps();
        _mm512_mask_storeu_ps(d + j, out, v);
      }
      continue;
    }
#endif
    if (!inside) {
      for (int64_t i = 0; i < ow_n; ++i) d[i] = 0.0f;
      continue;
    }
    for (int64_t i = 0; i < ow0; ++i) d[i] = 0.0f;
    for (int64_t i = ow1; i < ow_n; ++i) d[i] = 0.0f;
    const char* row = plane + ih * sh_b + (ow0 * win.sw + off) * sw_b;
    if (unit) {
      const float* sp = reinterpret_cast<const float*>(row);
      float* dp = d + ow0;
      for (int64_t i = 0, m = ow1 - ow0; i < m; ++i) dp[i] = sp[i];
    } else {
      for (int64_t ow = ow0; ow < ow1; ++ow) d[ow] = ld(row + (ow - ow0) * win.sw * sw_b);
    }
  }
}

#if defined(__AVX512F__)

namespace {

// col2im_plane for stride 1 and unit element steps: each plane row ih gathers
// its KH*KW contributions in registers (masked loads of the column rows that
// reach it) and is stored once, instead of KH*KW read-add-write passes.
void col2im_plane_gather(const char* rows, int64_t s1, int64_t h, int64_t w, const Window& win,
                         int64_t oh_n, int64_t ow_n, float* d) {
  for (int64_t ih = 0; ih < h; ++ih) {
    for (int64_t j = 0; j < w; j += 16) {
      __m512 acc = _mm512_setzero_ps();
      for (int64_t kh = 0; kh < win.kh; ++kh) {
        const int64_t oh = ih + win.ph - kh * win.dh;  // ih = oh - ph + kh*dh
        if (oh < 0 || oh >= oh_n) continue;
        for (int64_t kw = 0; kw < win.kw; ++kw) {
          const int64_t off = kw * win.dw - win.pw;  // iw = ow + off
          // Lanes iw = j + l with ow = iw - off in [0, ow_n) and iw < w.
          const __mmask16 m = run_mask(j, std::max<int64_t>(off, 0), std::min(w, ow_n + off));
          const float* src =
              reinterpret_cast<const float*>(rows + (kh * win.kw + kw) * s1) + oh * ow_n - off;
          acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, src + j));
        }
      }
      _mm512_mask_storeu_ps(d + ih * w + j, run_mask(j, 0, w), acc);
    }
  }
}

}  // namespace

#endif

void col2im_plane(const char* rows, int64_t s1, int64_t s2, int64_t h, int64_t w, const Window& win,
                  int64_t oh_n, int64_t ow_n, float* d) {
  const bool unit = win.sw == 1 && s2 == int64_t(sizeof(float));
#if defined(__AVX512F__)
  if (unit && win.sh == 1) return col2im_plane_gather(rows, s1, h, w, win, oh_n, ow_n, d);
#endif
  std::fill(d, d + h * w, 0.0f);
  for (int64_t kh = 0; kh < win.kh; ++kh) {
    for (int64_t kw = 0; kw < win.kw; ++kw) {
      const char* row = rows + (kh * win.kw + kw) * s1;
      const int64_t off = kw * win.dw - win.pw;
      int64_t ow0, ow1;
      valid_ow(off, win.sw, w, ow_n, &ow0, &ow1);
      const int64_t m = ow1 - ow0;
      if (m <= 0) continue;
      for (int64_t oh = 0; oh < oh_n; ++oh) {
        const int64_t ih = oh * win.sh - win.ph + kh * win.dh;
        if (ih < 0 || ih >= h) continue;
        // (ih, ow*sw + off) for the valid ow; the first one is in the plane.
        float* drow = d + ih * w + ow0 * win.sw + off;
        const char* srow = row + (oh * ow_n + ow0) * s2;
        if (unit) {
          const float* sp = reinterpret_cast<const float*>(srow);
#if defined(__AVX512F__)
          for (int64_t i = 0; i < m; i += 16) {
            const __mmask16 k = run_mask(i, 0, m);
            _mm512_mask_storeu_ps(drow + i, k,
                                  _mm512_add_ps(_mm512_maskz_loadu_ps(k, drow + i),
                                                _mm512_maskz_loadu_ps(k, sp + i)));
          }
#else
          for (int64_t i = 0; i < m; ++i) drow[i] += sp[i];
#endif
        } else {
          for (int64_t i = 0; i < m; ++i) drow[i * win.sw] += ld(srow + i * s2);
        }
      }
    }
  }
}

}  // namespace window

void kernel_IM2COL(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const Planes x(src);
  const Window win(op_params<Conv2dParams>(*dst));
  const int64_t c_in = src->shape[1], h = src->shape[2], w = src->shape[3];
  const int64_t oh_n = win.out_h(h), ow_n = win.out_w(w), kk = win.kh * win.kw;
  const auto [r0, r1] = items(t, dst->shape[0] * c_in * kk, oh_n * ow_n);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / (c_in * kk), c = (r / kk) % c_in;
    im2col_row(x.plane(n, c), x.sh, x.sw, h, w, win, (r % kk) / win.kw, r % win.kw, oh_n, ow_n,
               static_cast<float*>(dst->data) + r * oh_n * ow_n);
  }
}

void kernel_COL2IM(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* cols = dst->src[0];
  const Window win(op_params<Conv2dParams>(*dst));
  const int64_t c_in = dst->shape[1], h = dst->shape[2], w = dst->shape[3];
  const int64_t oh_n = win.out_h(h), ow_n = win.out_w(w), kk = win.kh * win.kw;
  const int64_t s0 = cols->stride[0], s1 = cols->stride[1], s2 = cols->stride[2];
  const auto [p0, p1] = items(t, dst->shape[0] * c_in, oh_n * ow_n * kk);
  for (int64_t pl = p0; pl < p1; ++pl) {
    const int64_t n = pl / c_in, c = pl % c_in;
    const char* rows = static_cast<const char*>(cols->data) + n * s0 + c * kk * s1;
    col2im_plane(rows, s1, s2, h, w, win, oh_n, ow_n, static_cast<float*>(dst->data) + pl * h * w);
  }
}

}  // namespace kiln::cpu
