// Reference: im2col/col2im and 2-D pooling (NCHW), straight from the definitions.
#include <cmath>
#include <limits>

#include "kiln/ext/tensor_node.h"
#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

struct Win {
  int64_t KH, KW, SH, SW, PH, PW, DH = 1, DW = 1;
};

Win conv_params(const Conv2dParams& p) { return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw}; }
Win pool_params(const Pool2dParams& p) { return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw}; }

int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

void check_win(const TensorNode* n, const Win& w) {
  if (w.KH < 1 || w.KW < 1 || w.SH < 1 || w.SW < 1 || w.PH < 0 || w.PW < 0 || w.DH < 1 || w.DW < 1)
    ref_fail(n, "bad window params");
}

int64_t at4(const Shape& s, int64_t n, int64_t c, int64_t h, int64_t w) {
  return ((n * s[1] + c) * s[2] + h) * s[3] + w;
}

}  // namespace

// IM2COL: x [N,C,H,W] -> [N, C*KH*KW, OH*OW]; row (c*KH+kh)*KW+kw, column oh*OW+ow.
RefValue ref_IM2COL(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Win w = conv_params(a.params<Conv2dParams>());
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
  const Win w = conv_params(a.params<Conv2dParams>());
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

namespace {

// Calls f(n, c, oh, ow, h, w) for every in-image position of every window.
template <class F>
void for_windows(const Shape& x, const Win& w, int64_t OH, int64_t OW, F&& f) {
  for (int64_t n = 0; n < x[0]; ++n)
    for (int64_t c = 0; c < x[1]; ++c)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t kh = 0; kh < w.KH; ++kh)
            for (int64_t kw = 0; kw < w.KW; ++kw) {
              const int64_t h = oh * w.SH - w.PH + kh, ww = ow * w.SW - w.PW + kw;
              if (h >= 0 && h < x[2] && ww >= 0 && ww < x[3]) f(n, c, oh, ow, h, ww);
            }
}

Shape pool_shape(const TensorNode* node, const Shape& x, const Win& w) {
  check_win(node, w);
  if (x.ndim() != 4) ref_fail(node, "input must be NCHW");
  return Shape{x[0], x[1], out_size(x[2], w.KH, w.SH, w.PH, 1),
               out_size(x[3], w.KW, w.SW, w.PW, 1)};
}

}  // namespace

// MAX_POOL2D: padding is -inf.
RefValue ref_MAX_POOL2D(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Win w = pool_params(a.params<Pool2dParams>());
  const Shape s = pool_shape(a.node, x.shape, w);
  RefValue r = ref_out(a.node, s);
  for (double& e : r.v) e = -std::numeric_limits<double>::infinity();
  for_windows(x.shape, w, s[2], s[3], [&](auto n, auto c, auto oh, auto ow, auto h, auto ww) {
    double& m = r.v[size_t(at4(s, n, c, oh, ow))];
    m = std::max(m, x.v[size_t(at4(x.shape, n, c, h, ww))]);
  });
  return r;
}

// MAX_POOL2D_BACK: src0 = x, src1 = grad of the pool output; each window's grad
// goes to the window's first maximum in row-major order.
RefValue ref_MAX_POOL2D_BACK(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RefValue& g = a.in(1);
  const Win w = pool_params(a.params<Pool2dParams>());
  const Shape s = pool_shape(a.node, x.shape, w);
  if (!(g.shape == s)) ref_fail(a.node, "grad is " + g.shape.str() + ", pool output is " + s.str());
  RefValue r = ref_out(a.node, x.shape);
  const size_t n_out = size_t(s.numel());
  std::vector<double> best(n_out, -std::numeric_limits<double>::infinity());
  std::vector<int64_t> where(n_out, -1);
  for_windows(x.shape, w, s[2], s[3], [&](auto n, auto c, auto oh, auto ow, auto h, auto ww) {
    const size_t o = size_t(at4(s, n, c, oh, ow));
    const int64_t xi = at4(x.shape, n, c, h, ww);
    if (where[o] < 0 || x.v[size_t(xi)] > best[o]) {  // strict: the first maximum stays
      best[o] = x.v[size_t(xi)];
      where[o] = xi;
    }
  });
  for (size_t o = 0; o < n_out; ++o)
    if (where[o] >= 0) r.v[size_t(where[o])] += g.v[o];
  return r;
}

// AVG_POOL2D: padding counts as zeros; always divide by KH*KW.
RefValue ref_AVG_POOL2D(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Win w = pool_params(a.params<Pool2dParams>());
  const Shape s = pool_shape(a.node, x.shape, w);
  RefValue r = ref_out(a.node, s);
  const double inv = 1.0 / double(w.KH * w.KW);
  for_windows(x.shape, w, s[2], s[3], [&](auto n, auto c, auto oh, auto ow, auto h, auto ww) {
    r.v[size_t(at4(s, n, c, oh, ow))] += x.v[size_t(at4(x.shape, n, c, h, ww))] * inv;
  });
  return r;
}

// AVG_POOL2D_BACK: adjoint of AVG_POOL2D; src0 = grad of the output, dst = x's shape.
RefValue ref_AVG_POOL2D_BACK(const RefArgs& a) {
  const RefValue& g = a.in(0);
  const Win w = pool_params(a.params<Pool2dParams>());
  const Shape& xs = a.node->shape;
  const Shape s = pool_shape(a.node, xs, w);
  if (!(g.shape == s)) ref_fail(a.node, "grad is " + g.shape.str() + ", pool output is " + s.str());
  RefValue r = ref_out(a.node);
  const double inv = 1.0 / double(w.KH * w.KW);
  for_windows(xs, w, s[2], s[3], [&](auto n, auto c, auto oh, auto ow, auto h, auto ww) {
    r.v[size_t(at4(xs, n, c, h, ww))] += g.v[size_t(at4(s, n, c, oh, ow))] * inv;
  });
  return r;
}

}  // namespace kiln::test
