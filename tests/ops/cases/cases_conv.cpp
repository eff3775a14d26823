// Cases: conv2d (stride, padding, dilation, bias, rectangular, strided operands),
// its backward ops and im2col/col2im directly, max/avg pooling (padding, overlapping windows) and
// their backward ops.
#include <cmath>
#include <limits>

#include "kiln/ext/op_params.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

struct Win {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
};

int64_t osz(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  return (in + 2 * p - d * (k - 1) - 1) / s + 1;
}

// Direct convolution (PyTorch conv2d), independent of im2col.
SpecFn conv_spec(Win w, bool bias) {
  return [w, bias](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue &x = in[0], &k = in[1];
    const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3], O = k.shape[0];
    const int64_t OH = osz(H, w.kh, w.sh, w.ph, w.dh), OW = osz(W, w.kw, w.sw, w.pw, w.dw);
    RefValue r = ref_value({N, O, OH, OW}, {});
    for (int64_t n = 0; n < N; ++n)
      for (int64_t o = 0; o < O; ++o)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double s = bias ? in[2].v[size_t(o)] : 0.0;
            for (int64_t c = 0; c < C; ++c)
              for (int64_t i = 0; i < w.kh; ++i)
                for (int64_t j = 0; j < w.kw; ++j) {
                  const int64_t h = oh * w.sh - w.ph + i * w.dh, ww = ow * w.sw - w.pw + j * w.dw;
                  if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
                  s += x.v[size_t(((n * C + c) * H + h) * W + ww)] *
                       k.v[size_t(((o * C + c) * w.kh + i) * w.kw + j)];
                }
            r.v.push_back(s);
          }
    return spec_compare(r, out);
  };
}

// PyTorch pooling: max pads with -inf; avg counts padding as zeros (divides by kh*kw).
SpecFn pool_spec(Win w, bool is_max) {
  return [w, is_max](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
    const int64_t OH = osz(H, w.kh, w.sh, w.ph, 1), OW = osz(W, w.kw, w.sw, w.pw, 1);
    RefValue r = ref_value({N, C, OH, OW}, {});
    for (int64_t nc = 0; nc < N * C; ++nc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double m = -std::numeric_limits<double>::infinity(), s = 0;
          for (int64_t i = 0; i < w.kh; ++i)
            for (int64_t j = 0; j < w.kw; ++j) {
              const int64_t h = oh * w.sh - w.ph + i, ww = ow * w.sw - w.pw + j;
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              const double v = x.v[size_t((nc * H + h) * W + ww)];
              m = std::max(m, v);
              s += v;
            }
          r.v.push_back(is_max ? m : s / double(w.kh * w.kw));
        }
    return spec_compare(r, out);
  };
}

Conv2dParams conv_params(const Win& w) { return {w.kh, w.kw, w.sh, w.sw, w.ph, w.pw, w.dh, w.dw}; }

void add_conv(std::vector<Case>& cs, Sz z) {
  const int64_t B = z(1, 8), C = z(2, 32), H = z(5, 32), O = z(3, 64);
  struct Cv {
    const char* name;
    Input x;
    Shape w;
    bool bias;
    Win win;
  };
  const Cv cvs[] = {
      {"conv2d", in("x", {B, C, H, H}), {O, C, 3, 3}, false, {3, 3, 1, 1, 0, 0}},
      {"conv2d_bias_batch2", in("x", {2, C, H, H}), {O, C, 3, 3}, true, {3, 3, 1, 1, 0, 0}},
      {"conv2d_stride2_pad1",
       in("x", {B, C, H + 1, H + 1}),
       {2, C, 3, 3},
       true,
       {3, 3, 2, 2, 1, 1}},
      {"conv2d_dilation2_pad2",
       in("x", {B, 1, H + 2, H + 2}),
       {2, 1, 3, 3},
       false,
       {3, 3, 1, 1, 2, 2, 2, 2}},
      {"conv2d_rect", in("x", {B, C, H, H + 2}), {2, C, 2, 3}, true, {2, 3, 1, 2, 1, 0}},
      {"conv2d_1x1", in("x", {2, 3, 3, 3}), {4, 3, 1, 1}, true, {1, 1, 1, 1, 0, 0}},
      {"conv2d_strided_input",
       with(in("x", {B, C, H, H}), Layout::narrowed),
       {2, C, 3, 3},
       true,
       {3, 3, 1, 1, 1, 1}},
      {"conv2d_batch9",
       in("x", {9, 2, 5, 4}),
       {3, 2, 3, 3},
       true,
       {3, 3, 1, 1, 1, 1}},  // > 8 images: dW groups
  };
  const Cv larger{"conv2d_larger",
                  in("x", {2, 3, z(12, 64), z(13, 64)}),
                  {8, 3, 3, 3},
                  true,
                  {3, 3, 1, 1, 1, 1}};
  for (const Cv& cv : cvs) {
    std::vector<Input> ins = {cv.x, in("w", cv.w, gen::uniform(-0.5, 0.5))};
    if (cv.bias) ins.push_back(in("b", {cv.w[0]}));
    const Win w = cv.win;
    const bool bias = cv.bias;
    auto build = [w, bias](Context&, X x) {
      Conv2dOptions o;
      o.stride[0] = w.sh, o.stride[1] = w.sw;
      o.padding[0] = w.ph, o.padding[1] = w.pw;
      o.dilation[0] = w.dh, o.dilation[1] = w.dw;
      return conv2d(x[0], x[1], bias ? x[2] : Tensor(), o);
    };
    Case c = make_case(cv.name, {Op::CONV2D}, ins, build, true);
    c.spec = conv_spec(w, bias);
    cs.push_back(c);
  }
  {  // larger, eval only
    std::vector<Input> ins = {larger.x, in("w", larger.w, gen::uniform(-0.5, 0.5)),
                              in("b", {larger.w[0]})};
    const Win w = larger.win;
    Case c = make_case(
        larger.name, {Op::CONV2D}, ins,
        [w](Context&, X x) {
          Conv2dOptions o;
          o.padding[0] = w.ph, o.padding[1] = w.pw;
          return conv2d(x[0], x[1], x[2], o);
        },
        false);
    c.spec = conv_spec(w, true);
    cs.push_back(c);
  }
  {  // a strided weight view (copied into a matrix by the kernels)
    const Win w{3, 3, 1, 1, 1, 1};
    Case c = make_case(
        "conv2d_strided_weight", {Op::CONV2D},
        {in("x", {2, C, H, H}),
         with(in("w", {O, C, 3, 3}, gen::uniform(-0.5, 0.5)), Layout::transposed)},
        [w](Context&, X x) {
          Conv2dOptions o;
          o.padding[0] = o.padding[1] = 1;
          return conv2d(x[0], x[1], Tensor(), o);
        },
        true);
    c.spec = conv_spec(w, false);
    cs.push_back(c);
  }
  // The fused backward ops directly (their gradients are the double-backward
  // rules); plain and strided (transposed-layout) operands.
  const Win wd{3, 3, 2, 1, 1, 0, 1, 2};
  const Shape xs{2, C, H + 2, H + 3}, ws{O, C, 3, 3};
  const Shape ys{2, O, osz(H + 2, 3, 2, 1, 1), osz(H + 3, 3, 1, 0, 2)};
  auto back_input = [wd, xs](Context&, X x) {
    return detail::make_op(Op::CONV2D_BACK_INPUT, DType::f32, xs, {x[0], x[1]}, conv_params(wd));
  };
  auto back_weight = [wd, ws](Context&, X x) {
    return detail::make_op(Op::CONV2D_BACK_WEIGHT, DType::f32, ws, {x[0], x[1]}, conv_params(wd));
  };
  const Gen wg = gen::uniform(-0.5, 0.5);
  cs.push_back(make_case("conv2d_back_input", {Op::CONV2D_BACK_INPUT},
                         {in("dy", ys), in("w", ws, wg)}, back_input, true));
  cs.push_back(
      make_case("conv2d_back_input_strided", {Op::CONV2D_BACK_INPUT},
                {with(in("dy", ys), Layout::transposed), with(in("w", ws, wg), Layout::transposed)},
                back_input, true));
  cs.push_back(make_case("conv2d_back_weight", {Op::CONV2D_BACK_WEIGHT},
                         {in("x", xs), in("dy", ys)}, back_weight, true));
  cs.push_back(
      make_case("conv2d_back_weight_strided", {Op::CONV2D_BACK_WEIGHT},
                {with(in("x", xs), Layout::transposed), with(in("dy", ys), Layout::transposed)},
                back_weight, true));
  // IM2COL / COL2IM through their public builders unfold / fold (each is the
  // other's gradient); `out` is the shape the builder must produce.
  const Win w1{2, 3, 1, 2, 1, 1}, w2{2, 2, 1, 1, 0, 0, 2, 2};
  auto opts = [](const Win& w) {
    UnfoldOptions o;
    o.kernel[0] = w.kh, o.kernel[1] = w.kw, o.stride[0] = w.sh, o.stride[1] = w.sw;
    o.padding[0] = w.ph, o.padding[1] = w.pw, o.dilation[0] = w.dh, o.dilation[1] = w.dw;
    return o;
  };
  auto im2col = [opts](Win w, Shape out) {
    return [w, out, opts](Context&, X x) {
      Tensor y = unfold(x[0], opts(w));
      if (y.shape() != out) fail("test", "unfold gave ", y.shape().str(), ", expected ", out.str());
      return y;
    };
  };
  auto col2im = [opts](Win w, Shape img) {
    return [w, img, opts](Context&, X x) { return fold(x[0], img[2], img[3], opts(w)); };
  };
  const int64_t h1 = z(4, 64), w1x = z(5, 64);
  const int64_t oh1 = osz(h1, 2, 1, 1, 1), ow1 = osz(w1x, 3, 2, 1, 1);
  const Shape cols1{B, C * 6, oh1 * ow1};
  cs.push_back(make_case("im2col_stride_pad", {Op::IM2COL}, {in("x", {B, C, h1, w1x})},
                         im2col(w1, cols1), true));
  const int64_t h2 = z(5, 64), oh2 = osz(h2, 2, 1, 0, 2);
  cs.push_back(make_case("im2col_dilated_strided", {Op::IM2COL},
                         {with(in("x", {2, 1, h2, h2}), Layout::transposed)},
                         im2col(w2, {2, 4, oh2 * oh2}), true));
  cs.push_back(make_case("col2im_stride_pad", {Op::COL2IM}, {in("cols", cols1)},
                         col2im(w1, {B, C, h1, w1x}), true));
  cs.push_back(make_case("col2im_dilated", {Op::COL2IM}, {in("cols", {2, 4, oh2 * oh2})},
                         col2im(w2, {2, 1, h2, h2}), true));
}

void add_pools(std::vector<Case>& cs, Sz z) {
  const int64_t B = z(1, 8), C = z(2, 32), H = z(4, 64);
  const Gen g = gen::distinct(-3, 3);  // no ties: FD-stable maxima
  struct Pl {
    const char* name;
    Input x;
    Win w;
    bool defaults;  // use Pool2dOptions' defaults (kernel 2, stride = kernel)
  };
  const Pl pls[] = {
      {"default", in("x", {B, C, H, H}, g), {2, 2, 2, 2, 0, 0}, true},
      {"k3_s2_p1", in("x", {2, 1, H + 1, H + 1}, g), {3, 3, 2, 2, 1, 1}, false},
      {"rect", in("x", {B, C, H + 1, H + 2}, g), {2, 3, 1, 2, 1, 1}, false},
      {"overlap_s1", in("x", {B, 1, H, H + 1}, g), {2, 2, 1, 1, 0, 0}, false},
      {"strided_input",
       with(in("x", {B, C, H, H + 2}, g), Layout::transposed),
       {2, 2, 2, 2, 0, 0},
       false},
      {"negative_padded", in("x", {B, C, H, H}, gen::distinct(-9, -1)), {3, 3, 1, 1, 1, 1}, false},
      {"larger", in("x", {1, 2, z(11, 64), z(13, 64)}, g), {3, 3, 2, 2, 1, 1}, false},
      // 2x2 stride 2 has its own vector path: odd H and W leave the last row and
      // column outside every window; 17 windows a row end in a partial vector.
      {"k2_s2_odd", in("x", {B, C, H + 1, H + 3}, g), {2, 2, 2, 2, 0, 0}, false},
      {"k2_s2_wide", in("x", {1, 2, 4, 35}, g), {2, 2, 2, 2, 0, 0}, false},
      {"k2_s2_narrowed",
       with(in("x", {B, C, H + 1, 35}, g), Layout::narrowed),
       {2, 2, 2, 2, 0, 0},
       false},
  };
  for (int is_max = 1; is_max >= 0; --is_max) {
    for (const Pl& pl : pls) {
      const Win w = pl.w;
      const bool defaults = pl.defaults;
      auto build = [w, defaults, is_max](Context&, X x) {
        Pool2dOptions o;
        if (!defaults) {
          o.kernel[0] = w.kh, o.kernel[1] = w.kw;
          o.stride[0] = w.sh, o.stride[1] = w.sw;
          o.padding[0] = w.ph, o.padding[1] = w.pw;
        }
        return is_max ? max_pool2d(x[0], o) : avg_pool2d(x[0], o);
      };
      Case c = make_case(std::string(is_max ? "max_pool2d_" : "avg_pool2d_") + pl.name,
                         {is_max ? Op::MAX_POOL2D : Op::AVG_POOL2D}, {pl.x}, build, true);
      c.spec = pool_spec(w, is_max);
      cs.push_back(c);
    }
    // Big enough to split over 2 and 3 threads (their results must be bit-identical).
    const Win k2{2, 2, 2, 2, 0, 0};
    Case big = make_case(
        std::string(is_max ? "max_pool2d_" : "avg_pool2d_") + "k2_s2_threads",
        {is_max ? Op::MAX_POOL2D : Op::AVG_POOL2D}, {in("x", {8, 8, 28, 29}, g)},
        [is_max](Context&, X x) { return is_max ? max_pool2d(x[0]) : avg_pool2d(x[0]); }, true);
    big.fd = false;
    big.spec = pool_spec(k2, is_max);
    cs.push_back(big);
  }
  // The backward ops directly. Ties in x (-0 and +0 too): the first maximum
  // (row-major) of each window gets the window's gradient.
  auto pool_params = [](Win w) { return Pool2dParams{w.kh, w.kw, w.sh, w.sw, w.ph, w.pw}; };
  struct Bk {
    const char* name;
    Shape x;
    Win w;
  };
  const Bk bks[] = {
      {"k2_s2", {B, C, H, H}, {2, 2, 2, 2, 0, 0}},
      {"k3_s1_p1_overlap", {B, C, H, H + 1}, {3, 3, 1, 1, 1, 1}},
      {"k2_s2_odd_wide", {B, C, H + 1, 35}, {2, 2, 2, 2, 0, 0}},
  };
  for (const Bk& bk : bks) {
    const Win w = bk.w;
    const Shape go{bk.x[0], bk.x[1], osz(bk.x[2], w.kh, w.sh, w.ph, 1),
                   osz(bk.x[3], w.kw, w.sw, w.pw, 1)};
    const Shape xs = bk.x;
    Case mb = make_case(
        std::string("max_pool2d_back_ties_") + bk.name, {Op::MAX_POOL2D_BACK},
        {constant(in("x", xs, gen::choice({-0.0, 0, 1, 1, 2}))), in("grad", go)},
        [w, xs, pool_params](Context&, X x) {
          return detail::make_op(Op::MAX_POOL2D_BACK, DType::f32, xs, {x[0], x[1]}, pool_params(w));
        },
        false);
    cs.push_back(mb);
    cs.push_back(make_case(
        std::string("avg_pool2d_back_") + bk.name, {Op::AVG_POOL2D_BACK}, {in("grad", go)},
        [w, xs, pool_params](Context&, X x) {
          return detail::make_op(Op::AVG_POOL2D_BACK, DType::f32, xs, {x[0]}, pool_params(w));
        },
        true));
  }
}

}  // namespace

void add_conv_cases(std::vector<Case>& cs, Sz z) {
  add_conv(cs, z);
  add_pools(cs, z);
}

}  // namespace kiln::test
