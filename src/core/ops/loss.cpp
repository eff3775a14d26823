// Loss builders: cross_entropy (the fused CROSS_ENTROPY primitive for i32 labels,
// whose rule uses CROSS_ENTROPY_BACK; a composite for probabilities) and mse_loss
// (a composite).
//
// Semantics decisions (PyTorch unless noted):
// - cross_entropy: logits f32 [N, C]; target either i32 class labels [N] or f32
//   probabilities [N, C] (PyTorch's "class probabilities" form). Reduction is the
//   mean over N. No label smoothing, no class weights. Labels out of [0, C) are
//   reported at run time by the kernels under the name "cross_entropy".
// - cross_entropy(logits, labels, CrossEntropyOptions): i32 labels only, with
//   ignore_index (PyTorch's, not on by default: kIgnoreIndex = -100 is its
//   default) and per-row weights. Mean over what counts, sum(w l) / sum(w);
//   where nothing counts the loss is 0, not PyTorch's NaN (kiln/ops.h).
// - mse_loss requires identical shapes (PyTorch only warns on broadcasting here,
//   since [N, 1] vs [N] is almost always a bug); mean over all elements.
#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor cross_entropy(Tensor logits, Tensor target) {
  const char* op = "cross_entropy";
  detail::check_defined(op, {logits, target});
  detail::check_same_ctx(op, {logits, target});
  detail::check_float32(op, "logits", logits);
  if (logits.ndim() != 2) fail(op, "logits must be [N, C], got ", logits.shape().str());
  const int64_t n = logits.shape()[0];
  Tensor probs;
  if (target.dtype() == i32) {
    if (target.ndim() != 1 || target.shape()[0] != n)
      fail(op, "labels are ", target.shape().str(), " but logits are ", logits.shape().str(),
           " (labels must be [", n, "])");
    // Fused: no one_hot and no [N, C] log-probabilities in the forward pass, and
    // a -inf non-target logit gives a finite loss (PyTorch's result).
    return Tensor(detail::new_op(Op::CROSS_ENTROPY, f32, Shape{}, {logits.node(), target.node()},
                                 CrossEntropyParams{}));
  } else if (target.dtype() == f32) {
    if (!(target.shape() == logits.shape()))
      fail(op, "target probabilities are ", target.shape().str(), " but logits are ",
           logits.shape().str());
    probs = target;
  } else {
    fail(op, "target must be i32 labels [N] or f32 probabilities [N, C] but is ",
         dtype_name(target.dtype()), " ", target.shape().str());
  }
  // Probabilities: a 0 probability times a -inf log-probability is NaN, as in
  // PyTorch. (Labels returned above: the fused op adds only the label's term.)
  return scale(sum(mul(probs, log_softmax(logits))), -1.0f / float(n));
}

Tensor cross_entropy(Tensor logits, Tensor labels, const CrossEntropyOptions& opt) {
  if (!opt.ignore_index && !opt.weight.defined()) return cross_entropy(logits, labels);
  const char* op = "cross_entropy";
  detail::check_defined(op, {logits, labels});
  detail::check_same_ctx(op, {logits, labels});
  detail::check_float32(op, "logits", logits);
  if (logits.ndim() != 2) fail(op, "logits must be [N, C], got ", logits.shape().str());
  const int64_t n = logits.shape()[0];
  if (labels.dtype() != i32 || labels.ndim() != 1 || labels.shape()[0] != n)
    fail(op, "ignore_index and weight take i32 labels [", n, "], got ", dtype_name(labels.dtype()),
         " ", labels.shape().str(), " for logits ", logits.shape().str());
  CrossEntropyParams p;
  p.ignore = opt.ignore_index.has_value();
  if (p.ignore) p.ignore_index = *opt.ignore_index;
  p.has_weight = opt.weight.defined();
  if (p.has_weight) {
    detail::check_same_ctx(op, {logits, opt.weight});
    detail::check_float32(op, "weight", opt.weight);
    if (opt.weight.ndim() != 1 || opt.weight.shape()[0] != n)
      fail(op, "weight ", opt.weight.label(), " is ", opt.weight.shape().str(), " but must be [", n,
           "] (one per row of logits ", logits.shape().str(), ")");
    return Tensor(detail::new_op(Op::CROSS_ENTROPY, f32, Shape{},
                                 {logits.node(), labels.node(), opt.weight.node()}, p));
  }
  return Tensor(detail::new_op(Op::CROSS_ENTROPY, f32, Shape{}, {logits.node(), labels.node()}, p));
}

Tensor mse_loss(Tensor a, Tensor b) {
  detail::check_defined("mse_loss", {a, b});
  detail::check_same_ctx("mse_loss", {a, b});
  detail::check_float32("mse_loss", "a", a);
  detail::check_float32("mse_loss", "b", b);
  if (!(a.shape() == b.shape()))
    fail("mse_loss", "a is ", a.shape().str(), " but b is ", b.shape().str());
  return mean(sqr(sub(a, b)));
}

namespace detail {

// CROSS_ENTROPY (labels get no gradient): d logits = (softmax - one_hot) * g / N.
// Masked: the same with each row's term times w / sum(w), ignored rows 0. The
// weights are constants (as the labels): one that wants a gradient is refused.
void backward_CROSS_ENTROPY(GradCtx& g) {
  const CrossEntropyParams p = g.params<Op::CROSS_ENTROPY>();
  if (p.has_weight && g.needs(2))
    fail("cross_entropy", "weight ", g.src(2).label(),
         " wants a gradient, but the per-row weights are constants (freeze or detach them)");
  if (!g.needs(0)) return;
  Tensor logits = g.src(0);
  if (p.has_weight)
    g.add(0, Tensor(new_op(Op::CROSS_ENTROPY_BACK, f32, logits.shape(),
                           {logits.node(), g.src(1).node(), g.grad().node(), g.src(2).node()}, p)));
  else
    g.add(0, Tensor(new_op(Op::CROSS_ENTROPY_BACK, f32, logits.shape(),
                           {logits.node(), g.src(1).node(), g.grad().node()}, p)));
}

}  // namespace detail

}  // namespace kiln
