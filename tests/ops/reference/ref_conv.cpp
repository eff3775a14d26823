// Reference: im2col/col2im (NCHW), straight from the definitions.
#include <cmath>
#include <limits>

#include "ops/reference/ref_window.h"
#include "ops/reference/reference.h"

namespace kiln::test {

using namespace ref_window;

// IM2COL: x [N,C,H,W] -> [N, C*KH*KW, OH*OW]; row (c*KH+kh)*KW+kw, column oh*OW+ow.
RefValue ref_IM2COL(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RefWin w = conv_params(a.params<Conv2dParams>());
  check_win(a.node, w);
  if (x.shape.ndim() != 4) ref_fail(a.node, "input must be NCHW");
  const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
  const int64_t OH = out_size(H, w.KH, w.SH, w.PH, w.DH), OW = out_size(W, w.KW, w.SW, w.PW, w.DW);
  RefValue r = ref_out(a.node, Shape{N, C * w.KH * w.KW, OH * OW});
  const int64_t cols = C * w.KH * w.KW;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t kh = 0; kh < w.KH; ++kh)
            for (int64_t kw = 0; kw < w.KW; ++kw) {
              const int64_t h = oh * w.SH - w.PH + kh * w.DH, ww = ow * w.SW - w.PW + kw * w.DW;
              const double v = h >= 0 && h < H && ww >= 0 && ww < W
                                   ? x.v[size_t(at4(x.shape, n, c, h, ww))]
                                   : 0.0;
              r.v[size_t((n * cols + (c * w.KH + kh) * w.KW + kw) * OH * OW + oh * OW + ow)] = v;
            }
  return r;
}

// COL2IM: the adjoint of IM2COL; the image shape [N,C,H,W] is the node's shape.
RefValue ref_COL2IM(const RefArgs& a) {
  const RefValue& col = a.in(0);
  const RefWin w = conv_params(a.params<Conv2dParams>());
  check_win(a.node, w);
  const Shape& s = a.node->shape;
  if (s.ndim() != 4) ref_fail(a.node, "output must be NCHW");
  const int64_t N = s[0], C = s[1], H = s[2], W = s[3];
  const int64_t OH = out_size(H, w.KH, w.SH, w.PH, w.DH), OW = out_size(W, w.KW, w.SW, w.PW, w.DW);
  const int64_t cols = C * w.KH * w.KW;
  if (!(col.shape == Shape{N, cols, OH * OW}))
    ref_fail(a.node,
             "columns are " + col.shape.str() + ", expected " + Shape{N, cols, OH * OW}.str());
  RefValue r = ref_out(a.node);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t kh = 0; kh < w.KH; ++kh)
            for (int64_t kw = 0; kw < w.KW; ++kw) {
              const int64_t h = oh * w.SH - w.PH + kh * w.DH, ww = ow * w.SW - w.PW + kw * w.DW;
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              r.v[size_t(at4(s, n, c, h, ww))] +=
                  col.v[size_t((n * cols + (c * w.KH + kh) * w.KW + kw) * OH * OW + oh * OW + ow)];
            }
  return r;
}

}  // namespace kiln::test
