// Convolution builders: conv2d (CONV2D, + ADD for the bias), unfold (IM2COL) and
// fold (COL2IM), and the backward rules of the convolution ops.
//
// Semantics decisions (PyTorch unless noted):
// - conv2d: x f32 [N, C, H, W], weight f32 [O, C, KH, KW], bias f32 [O] optional;
//   groups = 1 only; zero padding; stride >= 1, padding >= 0, dilation >= 1.
//   One CONV2D node: the CPU kernel unfolds one image at a time into columns
//   [C*KH*KW, OH*OW] kept in cache and multiplies weight[O, C*KH*KW] by them, so
//   the unfolded batch (9x the input) never goes through memory. (IM2COL +
//   MATMUL express the same thing as a composite; measured 2-3x slower for
//   kiln-mnist's cnn, docs/benchmarks.md.) CONV2D, CONV2D_BACK_INPUT and
//   CONV2D_BACK_WEIGHT are bilinear and each one's gradients are the others.
//   Under the bf16 precision policy x, weight (and dy backward) are cast to
//   bf16 in the graph; the kernels take f32 or bf16 sources, results f32.
// - Output size (core/ops/window.h): floor((H + 2P - D*(K-1) - 1) / S) + 1 (ceil_mode=False); an
//   output size <= 0 is an error.
#include "core/autodiff.h"
#include "core/ops/window.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor conv2d(Tensor x, Tensor weight, Tensor bias, const Conv2dOptions& opt) {
  const char* op = "conv2d";
  detail::check_defined(op, {x, weight});
  detail::check_same_ctx(op, {x, weight, bias});
  detail::check_nchw(op, x);
  detail::check_float32(op, "weight", weight);
  if (weight.ndim() != 4) fail(op, "weight must be [O, C, KH, KW], got ", weight.shape().str());
  const Shape& xs = x.shape();
  const Shape& ws = weight.shape();
  const int64_t n = xs[0], c = xs[1], o = ws[0], kh = ws[2], kw = ws[3];
  if (ws[1] != c)
    fail(op, "x is ", xs.str(), " with ", c, " channels but weight is ", ws.str(), " for ", ws[1],
         " input channels (groups=1 only)");
  if (bias.defined()) {
    detail::check_float32(op, "bias", bias);
    if (bias.ndim() != 1 || bias.shape()[0] != o)
      fail(op, "bias is ", bias.shape().str(), " but weight is ", ws.str(), " (bias must be [", o,
           "])");
  }
  for (int i = 0; i < 2; ++i) {
    if (opt.stride[i] < 1 || opt.padding[i] < 0 || opt.dilation[i] < 1)
      fail(op, "stride (", opt.stride[0], ", ", opt.stride[1], ") and dilation (", opt.dilation[0],
           ", ", opt.dilation[1], ") must be >= 1 and padding (", opt.padding[0], ", ",
           opt.padding[1], ") >= 0");
  }
  const int64_t oh = detail::window_out_size(op, "height", xs[2], kh, opt.stride[0], opt.padding[0],
                                             opt.dilation[0], xs);
  const int64_t ow = detail::window_out_size(op, "width", xs[3], kw, opt.stride[1], opt.padding[1],
                                             opt.dilation[1], xs);
  const Conv2dParams p{kh,
                       kw,
                       opt.stride[0],
                       opt.stride[1],
                       opt.padding[0],
                       opt.padding[1],
                       opt.dilation[0],
                       opt.dilation[1]};
  // The context's bf16 policy (Context::set_matmul_precision): x and weight cast
  // to bf16, the products of their columns bf16 x bf16 with f32 accumulation;
  // the result (and the bias add) stays f32.
  if (x.node()->ctx->matmul_precision() == bf16) {
    x = x.to(bf16);
    weight = weight.to(bf16);
  }
  Tensor y(detail::new_op(Op::CONV2D, f32, {n, o, oh, ow}, {x.node(), weight.node()}, p));
  if (bias.defined()) y = add(y, bias.reshape({1, o, 1, 1}));
  return y;
}

namespace {

// The window geometry of unfold/fold, checked; fills the output size.
Conv2dParams window_params(const char* op, const UnfoldOptions& opt, int64_t h, int64_t w,
                           const Shape& xs, int64_t* oh, int64_t* ow) {
  for (int i = 0; i < 2; ++i) {
    if (opt.kernel[i] < 1 || opt.stride[i] < 1 || opt.padding[i] < 0 || opt.dilation[i] < 1)
      fail(op, "kernel (", opt.kernel[0], ", ", opt.kernel[1], "), stride (", opt.stride[0], ", ",
           opt.stride[1], ") and dilation (", opt.dilation[0], ", ", opt.dilation[1],
           ") must be >= 1 and padding (", opt.padding[0], ", ", opt.padding[1], ") >= 0");
  }
  *oh = detail::window_out_size(op, "height", h, opt.kernel[0], opt.stride[0], opt.padding[0],
                                opt.dilation[0], xs);
  *ow = detail::window_out_size(op, "width", w, opt.kernel[1], opt.stride[1], opt.padding[1],
                                opt.dilation[1], xs);
  return Conv2dParams{opt.kernel[0],  opt.kernel[1],  opt.stride[0],   opt.stride[1],
                      opt.padding[0], opt.padding[1], opt.dilation[0], opt.dilation[1]};
}

}  // namespace

Tensor unfold(Tensor x, const UnfoldOptions& opt) {
  const char* op = "unfold";
  detail::check_defined(op, {x});
  detail::check_nchw(op, x);
  const Shape& xs = x.shape();
  int64_t oh = 0, ow = 0;
  const Conv2dParams p = window_params(op, opt, xs[2], xs[3], xs, &oh, &ow);
  return Tensor(
      detail::new_op(Op::IM2COL, f32, {xs[0], xs[1] * p.kh * p.kw, oh * ow}, {x.node()}, p));
}

Tensor fold(Tensor cols, int64_t out_h, int64_t out_w, const UnfoldOptions& opt) {
  const char* op = "fold";
  detail::check_defined(op, {cols});
  detail::check_float32(op, "cols", cols);
  const Shape& cs = cols.shape();
  if (cols.ndim() != 3) fail(op, "cols must be [N, C*KH*KW, L], got ", cs.str());
  if (out_h < 1 || out_w < 1) fail(op, "output size (", out_h, ", ", out_w, ") must be >= 1");
  int64_t oh = 0, ow = 0;
  const Shape img_for_errors{cs[0], 0, out_h, out_w};
  const Conv2dParams p = window_params(op, opt, out_h, out_w, img_for_errors, &oh, &ow);
  const int64_t k = p.kh * p.kw;
  if (cs[1] % k != 0)
    fail(op, "cols ", cs.str(), ": dim 1 (", cs[1], ") must be a multiple of the kernel size ",
         p.kh, "x", p.kw);
  if (cs[2] != oh * ow)
    fail(op, "cols ", cs.str(), " has ", cs[2], " windows but an output of (", out_h, ", ", out_w,
         ") with these ", "options has ", oh, "x", ow, " = ", oh * ow);
  return Tensor(
      detail::new_op(Op::COL2IM, f32, {cs[0], cs[1] / k, out_h, out_w}, {cols.node()}, p));
}

namespace detail {

namespace {

Tensor conv_back_input(Tensor dy, Tensor weight, const Shape& x_shape, const Conv2dParams& p) {
  return Tensor(new_op(Op::CONV2D_BACK_INPUT, f32, x_shape, {dy.node(), weight.node()}, p));
}

Tensor conv_back_weight(Tensor x, Tensor dy, const Shape& w_shape, const Conv2dParams& p) {
  return Tensor(new_op(Op::CONV2D_BACK_WEIGHT, f32, w_shape, {x.node(), dy.node()}, p));
}

Tensor conv(Tensor x, Tensor weight, const Shape& y_shape, const Conv2dParams& p) {
  return Tensor(new_op(Op::CONV2D, f32, y_shape, {x.node(), weight.node()}, p));
}

}  // namespace

// y = conv(x, w): <G, y> = <back_input(G, w), x> = <back_weight(x, G), w>.
void backward_CONV2D(GradCtx& g) {
  const Tensor x = g.src(0), w = g.src(1);
  // Under the bf16 policy both products take dy as bf16: cast it once.
  Tensor gy = g.grad();
  if (gy.node()->ctx->matmul_precision() == bf16 && gy.dtype() == f32) gy = gy.to(bf16);
  if (g.needs(0)) g.add(0, conv_back_input(gy, w, x.shape(), g.params<Op::CONV2D>()));
  if (g.needs(1)) g.add(1, conv_back_weight(x, gy, w.shape(), g.params<Op::CONV2D>()));
}

// dx = back_input(dy, w) is linear in dy (adjoint: conv) and in w.
void backward_CONV2D_BACK_INPUT(GradCtx& g) {
  const Tensor dy = g.src(0), w = g.src(1), gx = g.grad();
  if (g.needs(0)) g.add(0, conv(gx, w, dy.shape(), g.params<Op::CONV2D_BACK_INPUT>()));
  if (g.needs(1)) g.add(1, conv_back_weight(gx, dy, w.shape(), g.params<Op::CONV2D_BACK_INPUT>()));
}

// dw = back_weight(x, dy): in x the adjoint is back_input(dy, .), in dy conv(x, .).
void backward_CONV2D_BACK_WEIGHT(GradCtx& g) {
  const Tensor x = g.src(0), dy = g.src(1), gw = g.grad();
  if (g.needs(0)) g.add(0, conv_back_input(dy, gw, x.shape(), g.params<Op::CONV2D_BACK_WEIGHT>()));
  if (g.needs(1)) g.add(1, conv(x, gw, dy.shape(), g.params<Op::CONV2D_BACK_WEIGHT>()));
}

// IM2COL and COL2IM are adjoint linear maps: each one's gradient is the other.
void backward_IM2COL(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::COL2IM, f32, g.src(0).shape(), {g.grad().node()},
                         g.params<Op::IM2COL>())));
}

void backward_COL2IM(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::IM2COL, f32, g.src(0).shape(), {g.grad().node()},
                         g.params<Op::COL2IM>())));
}

}  // namespace detail

}  // namespace kiln
