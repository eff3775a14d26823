// Loss builders: cross_entropy (the fused CROSS_ENTROPY primitive for i32 labels,
// whose rule uses CROSS_ENTROPY_BACK; a composite for probabilities) and mse_loss
// (a composite).
//
// Semantics decisions (PyTorch unless noted):
// - cross_entropy: logits f32 [N, C]; target either i32 class labels [N] or f32
//   probabilities [N, C] (PyTorch's "class probabilities" form). Reduction is the
//   mean over N. No ignore_index, no label smoothing, no class weights. Labels
//   out of [0, C) are reported at run time by the ONE_HOT kernel under the name
//   "cross_entropy".
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
    return Tensor(detail::new_op(Op::CROSS_ENTROPY, f32, Shape{}, {logits.node(), target.node()}));
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
void backward_CROSS_ENTROPY(GradCtx& g) {
  if (!g.needs(0)) return;
  Tensor logits = g.src(0);
  g.add(0, Tensor(new_op(Op::CROSS_ENTROPY_BACK, f32, logits.shape(),
                         {logits.node(), g.src(1).node(), g.grad().node()})));
}

}  // namespace detail

}  // namespace kiln
