// The loss and metrics of an OptContext (see loss_metrics.h).
#include "opt/loss_metrics.h"

#include "kiln/ops.h"

namespace kiln {

namespace {

bool is_leaf(Tensor t) { return t.op() == Op::NONE; }

}  // namespace

void LossMetrics::build(const OptConfig& cfg) {
  const char* op = "opt";
  if (!cfg.inputs.defined()) fail(op, "inputs is an undefined tensor");
  if (!cfg.outputs.defined()) fail(op, "outputs is an undefined tensor");
  if (!is_leaf(cfg.inputs))
    fail(op, "inputs ", cfg.inputs.label(), " must be a leaf (Context::input)");
  if (cfg.inputs.ndim() < 1) fail(op, "inputs ", cfg.inputs.label(), " needs a batch dim");
  inputs = cfg.inputs;
  outputs = cfg.outputs;
  const int64_t B = batch();
  Context& ctx = inputs.ctx();
  if (&outputs.ctx() != &ctx) fail(op, "inputs and outputs come from different contexts");

  labels = cfg.labels;
  if (labels.defined() && !is_leaf(labels))
    fail(op, "labels ", labels.label(), " must be a leaf (Context::input)");
  switch (cfg.loss) {
    case LossKind::cross_entropy:
      if (outputs.ndim() != 2 || outputs.size(0) != B)
        fail(op, "cross-entropy needs logits [", B, ", classes] but outputs is ",
             outputs.shape().str());
      if (!labels.defined()) labels = ctx.input(i32, {B}, "labels");
      loss = cross_entropy(outputs, labels);
      break;
    case LossKind::mse:
      if (!labels.defined()) labels = ctx.input(f32, outputs.shape(), "labels");
      loss = mse_loss(outputs, labels);
      break;
    case LossKind::user:
      if (!cfg.user_loss.defined()) fail(op, "LossKind::user needs OptConfig::user_loss");
      loss = cfg.user_loss;
      break;
  }
  if (loss.numel() != 1 || loss.dtype() != f32)
    fail(op, "the loss must be a one-element f32 tensor, got ", dtype_name(loss.dtype()), " ",
         loss.shape().str());
  if (labels.defined() && (labels.ndim() < 1 || labels.size(0) != B))
    fail(op, "labels ", labels.label(), " ", labels.shape().str(), " must have the batch size ", B,
         " of inputs ", inputs.shape().str(), " as first dim");
  loss.set_name("loss");

  // Accuracy: argmax of [B, C] outputs against class ids (or one-hot rows).
  if (cfg.loss != LossKind::mse && labels.defined() && outputs.ndim() == 2 && outputs.size(1) > 1) {
    pred = argmax(outputs, -1).set_name("pred");
    if (labels.dtype() == i32 && labels.ndim() == 1) correct = count_equal(pred, labels);
    else if (labels.ndim() == 2 && labels.shape() == outputs.shape())
      correct = count_equal(pred, argmax(labels, -1));
    if (correct.defined()) correct.set_name("n_correct");
  }
  if (cfg.loss != LossKind::user) build_partial(cfg.loss);
}

// The loss per row with the formulas of the batch loss (cross-entropy:
// -sum(target * log_softmax(row)) with one-hot targets for class ids; mse: the
// row's sum of squared differences), masked, summed and divided by the real
// element count.
void LossMetrics::build_partial(LossKind kind) {
  Context& ctx = inputs.ctx();
  const int64_t B = batch();
  sample_mask = ctx.input(f32, {B}, "opt.sample_mask");
  Tensor per_row;
  float per = 1;
  if (kind == LossKind::cross_entropy) {
    const int64_t C = outputs.size(1);
    Tensor target = labels.dtype() == i32 ? one_hot(labels, C) : labels;
    per_row = -sum(log_softmax(outputs) * target, 1);
  } else {
    per = float(outputs.numel() / B);
    const Tensor d = outputs - labels;
    per_row = sum((d * d).reshape({B, outputs.numel() / B}), 1);
  }
  partial_loss =
      (sum(per_row * sample_mask) / (sum(sample_mask) * per)).set_name("opt.partial_loss");
  if (correct.defined()) {
    Tensor target = labels.dtype() == i32 ? labels : argmax(labels, -1);
    partial_correct = sum(eq(pred, target) * sample_mask).set_name("opt.partial_correct");
  }
}

}  // namespace kiln
