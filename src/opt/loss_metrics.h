// Internal to src/opt: the first part of an OptContext, what it measures. The
// loss (cross-entropy, mse or the user's), the labels input, the accuracy
// (argmax of the outputs against the labels), and the partial-batch tail: the
// same loss and accuracy over the real rows of a padded last batch, computed in
// the graph from a per-sample mask.
#pragma once
#include "kiln/opt.h"

namespace kiln {

struct LossMetrics {
  Tensor inputs, outputs, labels, loss;
  Tensor pred, correct;  // i32 [B] and i32 scalar; undefined without accuracy

  // The partial batch (cross-entropy and mse; undefined for a user loss, which
  // cannot be split per sample). sample_mask is an f32 [B] input, 1 for a real
  // row and 0 for padding; partial_loss is the mean loss over the real rows
  // (the graph's formula for a batch of just those rows) and partial_correct
  // the f32 count of real rows predicted right (undefined without accuracy).
  Tensor sample_mask, partial_loss, partial_correct;

  // Checks the configuration and builds loss, labels and accuracy nodes.
  // Throws kiln::Error "[opt] ..." for inconsistent configurations.
  void build(const OptConfig& cfg);
  int64_t batch() const { return inputs.size(0); }
  bool splittable() const { return partial_loss.defined(); }

 private:
  void build_partial(LossKind kind);
};

}  // namespace kiln
