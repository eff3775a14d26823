// Reference: 2-D pooling (NCHW), straight from the definitions.
#include <cmath>
#include <limits>

#include "ops/reference/ref_window.h"
#include "ops/reference/reference.h"

namespace kiln::test {

using namespace ref_window;

namespace {

// Calls f(n, c, oh, ow, h, w) for every in-image position of every window.
template <class F>
void for_windows(const Shape& x, const RefWin& w, int64_t OH, int64_t OW, F&& f) {
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

Shape pool_shape(const TensorNode* node, const Shape& x, const RefWin& w) {
  check_win(node, w);
  if (x.ndim() != 4) ref_fail(node, "input must be NCHW");
  return Shape{x[0], x[1], out_size(x[2], w.KH, w.SH, w.PH, 1),
               out_size(x[3], w.KW, w.SW, w.PW, 1)};
}

}  // namespace

// MAX_POOL2D: padding is -inf.
RefValue ref_MAX_POOL2D(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RefWin w = pool_params(a.params<Pool2dParams>());
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
  const RefWin w = pool_params(a.params<Pool2dParams>());
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
  const RefWin w = pool_params(a.params<Pool2dParams>());
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
  const RefWin w = pool_params(a.params<Pool2dParams>());
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
