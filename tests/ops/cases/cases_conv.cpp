// Cases: conv2d (stride, padding, dilation, bias, rectangular, strided operands),
// its backward ops and im2col/col2im directly.
#include <cmath>
#include <limits>
#include <string>

#include "kiln/ext/op_params.h"
#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

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
  // bf16 sources (what the bf16 policy gives the kernels): the columns are
  // multiplied as bf16 x bf16 with f32 accumulation, so against the reference on
  // the same bf16 values only f32's accumulation error remains.
  auto bf = [](Input x, Layout l = Layout::contig) { return with(as(x, DType::bf16), l); };
  for (const bool strided : {false, true}) {
    const Layout l = strided ? Layout::transposed : Layout::contig;
    const std::string sfx = strided ? "_strided" : "";
    Case bi = make_case("conv2d_back_input_bf16" + sfx, {Op::CONV2D_BACK_INPUT},
                        {bf(in("dy", ys), l), bf(in("w", ws, wg), l)}, back_input, false);
    bi.tol = {1e-5, 1e-4};
    cs.push_back(bi);
    Case bw = make_case("conv2d_back_weight_bf16" + sfx, {Op::CONV2D_BACK_WEIGHT},
                        {bf(in("x", xs), l), bf(in("dy", ys), l)}, back_weight, false);
    bw.tol = {1e-5, 1e-4};
    cs.push_back(bw);
  }
  // The context's bf16 policy: x and weight cast in the graph, dy cast once in
  // the backward pass; more than 8 images (dW groups), padding and stride.
  // Finite differences cannot see through the casts: the CPU's gradients are
  // compared with the reference's backward graph (which rounds the same casts;
  // a dy element on a rounding tie may round the other way in f32).
  Case policy = no_fd(make_case(
      "conv2d_bf16_precision_policy", {Op::CONV2D, Op::COPY},
      {in("x", {9, 3, z(12, 64), z(11, 64)}), in("w", {8, 3, 3, 3}, wg), in("b", {8})},
      [](Context& ctx, X x) {
        ctx.set_matmul_precision(bf16);
        Conv2dOptions o;
        o.padding[0] = o.padding[1] = 1;
        o.stride[1] = 2;
        return conv2d(x[0], x[1], x[2], o);
      },
      true));
  policy.tol = {1e-5, 1e-4};
  policy.grad_tol = {1e-3, 1e-3};
  cs.push_back(policy);
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

}  // namespace

void add_conv_cases(std::vector<Case>& cs, Sz z) { add_conv(cs, z); }

}  // namespace kiln::test
