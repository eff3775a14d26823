// Gradient checkpointing inside Graph::backward (docs/design.md, "Autodiff").
// Forward nodes that feed a checkpoint (kFlagCheckpoint), up to the previous
// checkpoints and the leaves, are "recomputed": backward rules read copies of
// them that the backward pass computes again from the checkpoints, so the
// originals are read by forward nodes only and the graph allocator frees them
// after the forward pass. Copies are made lazily, when a rule reads a tensor.
#pragma once
#include <span>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::detail {

class Recompute {
 public:
  // `forward`: the graph's forward nodes in execution order.
  explicit Recompute(std::span<TensorNode* const> forward);
  bool active() const { return !recomputed_.empty(); }
  // The tensor a backward rule reads for forward tensor n: n itself, or (for a
  // recomputed node) its copy, whose sources are copies too where they are
  // recomputed. Copies repeat op and parameters exactly, so a dropout mask
  // (RAND_MASK with the same seeds) comes out the same.
  TensorNode* of(TensorNode* n);

 private:
  TensorNode* copy(TensorNode* n);
  std::unordered_set<const TensorNode*> recomputed_;
  std::unordered_map<const TensorNode*, TensorNode*> copies_;
};

}  // namespace kiln::detail
