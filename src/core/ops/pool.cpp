// Pooling builders: max_pool2d (MAX_POOL2D, its rule uses MAX_POOL2D_BACK) and
// avg_pool2d (AVG_POOL2D / AVG_POOL2D_BACK, adjoint to each other), with
// backward rules.
//
// Semantics decisions (PyTorch unless noted):
// - max_pool2d / avg_pool2d: stride 0 means "same as kernel" (PyTorch default);
//   padding must be at most half the kernel (as PyTorch), so no window lies fully
//   in the padding. max_pool2d pads with -inf and sends each window's gradient to
//   its first maximum (row-major); avg_pool2d counts padding as zeros and always
//   divides by KH*KW (count_include_pad=True). No dilation, no ceil_mode.
#include "core/autodiff.h"
#include "core/ops/window.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

Tensor pool2d(Op op_id, const char* op, Tensor x, const Pool2dOptions& opt) {
  detail::check_defined(op, {x});
  detail::check_nchw(op, x);
  Pool2dParams p;
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    const int64_t k = opt.kernel[i], s = opt.stride[i] == 0 ? k : opt.stride[i],
                  pd = opt.padding[i];
    if (k < 1 || s < 1 || pd < 0)
      fail(op, "kernel (", opt.kernel[0], ", ", opt.kernel[1], ") must be >= 1, stride (",
           opt.stride[0], ", ", opt.stride[1], ") >= 0 and padding (", opt.padding[0], ", ",
           opt.padding[1], ") >= 0");
    if (2 * pd > k)
      fail(op, "padding (", opt.padding[0], ", ", opt.padding[1],
           ") must be at most half the kernel (", opt.kernel[0], ", ", opt.kernel[1], ")");
    out[i] = detail::window_out_size(op, i == 0 ? "height" : "width", x.shape()[2 + i], k, s, pd, 1,
                                     x.shape());
    (i == 0 ? p.kh : p.kw) = k;
    (i == 0 ? p.sh : p.sw) = s;
    (i == 0 ? p.ph : p.pw) = pd;
  }
  const Shape& xs = x.shape();
  return Tensor(detail::new_op(op_id, f32, {xs[0], xs[1], out[0], out[1]}, {x.node()}, p));
}

}  // namespace

Tensor max_pool2d(Tensor x, const Pool2dOptions& opt) {
  return pool2d(Op::MAX_POOL2D, "max_pool2d", x, opt);
}

Tensor avg_pool2d(Tensor x, const Pool2dOptions& opt) {
  return pool2d(Op::AVG_POOL2D, "avg_pool2d", x, opt);
}

namespace detail {

void backward_MAX_POOL2D(GradCtx& g) {
  if (!g.needs(0)) return;
  const Tensor x = g.src(0);
  g.add(0, Tensor(new_op(Op::MAX_POOL2D_BACK, f32, x.shape(), {x.node(), g.grad().node()},
                         g.params<Op::MAX_POOL2D>())));
}

void backward_AVG_POOL2D(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::AVG_POOL2D_BACK, f32, g.src(0).shape(), {g.grad().node()},
                         g.params<Op::AVG_POOL2D>())));
}

// AVG_POOL2D_BACK is linear in its input; its adjoint is the pooling itself.
void backward_AVG_POOL2D_BACK(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::AVG_POOL2D, f32, g.src(0).shape(), {g.grad().node()},
                         g.params<Op::AVG_POOL2D_BACK>())));
}

}  // namespace detail

}  // namespace kiln
