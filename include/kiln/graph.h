// Graph: the nodes needed to compute some outputs, in execution order, plus the
// backward pass (gradient nodes) once backward() has run.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/tensor.h"

namespace kiln {

class Graph {
 public:
  Graph() = default;
  // Every node `outputs` depend on, sources before consumers. Outputs are flagged
  // kFlagOutput.
  [[nodiscard]] static Graph forward(Tensor output);
  [[nodiscard]] static Graph forward(std::initializer_list<Tensor> outputs);
  // Adds another output (and what it needs) to the graph.
  void expand(Tensor output);

  // Appends the backward pass of scalar `loss`: one pass marks the nodes on a path
  // from a param to the loss, then gradient nodes are built in reverse order (linear
  // in the graph size). Each param gets a gradient accumulator that the graph adds
  // into (grads accumulate over runs until reset_grads()). Call once per graph.
  void backward(Tensor loss);

  // The gradient of `t`: for params the accumulator, otherwise the gradient node
  // (undefined when t got none).
  Tensor grad(Tensor t) const;
  bool has_backward() const { return n_forward_ != nodes_.size() || !grads_.empty(); }
  // Zero every param's gradient accumulator (they must have memory).
  void reset_grads();

  // Nodes in execution order: views and computed nodes. Leaves are listed apart.
  // Both throw kiln::Error "[graph] ... destroyed" once the nodes' Context is gone.
  const std::vector<TensorNode*>& nodes() const {
    check_alive();
    return nodes_;
  }
  const std::vector<TensorNode*>& leafs() const {
    check_alive();
    return leafs_;
  }
  size_t n_forward() const { return n_forward_; }

  // Mixed precision: each COPY f32 -> bf16 whose source s is a contiguous
  // LAYER_NORM, GELU, GELU_ERF, GELU_BACK, GELU_ERF_BACK or MATMUL result (or a
  // contiguous reshape of one, or of a reshape of it) that nothing else reads
  // (no other node of the context; not an output, input, param, loss or
  // checkpoint) takes over s's op and stores bf16 itself; s leaves the graph
  // and is no longer computed (grad() of a tensor whose gradient was s or its
  // reshape returns the bf16 cast, or a reshape of it, instead). Values are
  // bit-identical to the cast's. Only the CPU backend's kernels store those ops
  // in bf16: run the graph there. Call after the graph is complete (backward
  // included), before allocating it. Returns the casts fused.
  size_t fuse_bf16_casts();
  // Mixed precision, as PyTorch's autocast: a GELU_BACK or GELU_ERF_BACK result
  // (a Linear's output gradient) that is cast to bf16 for the Linear's products
  // and also summed (its bias gradient: SUM nodes, f32 results) has those SUMs
  // read the bf16 cast instead (each element widened exactly, summed in f32).
  // Then nothing but the cast reads the f32 gradient, so fuse_bf16_casts (call
  // it next) lets the op store bf16 and the f32 gradient is never written. The
  // bias gradients change by the rounding of their terms. CPU kernels only;
  // call after the graph is complete. Returns the sums re-pointed.
  size_t sum_bf16_gradients();
  // Mixed precision, as PyTorch's autocast: a GELU or GELU_ERF whose input is
  // a MATMUL result of bf16 factors (a Linear under the bf16 policy; directly or
  // through up to two contiguous reshapes) that nothing but GELU and its
  // backward (GELU_BACK / GELU_ERF_BACK, as x) reads gets that input through a
  // cast to bf16, which fuse_bf16_casts (call it next) folds into the product:
  // the Linear stores bf16, GELU and its backward read it, and the f32 output
  // is never written. GELU's values change by the input's rounding (2^-9
  // relative). CPU kernels only; call after the graph is complete. Returns the
  // inputs cast.
  size_t bf16_gelu_inputs();
  // Drops the bf16 casts that only matmuls read (directly or through a
  // permuted view): the matmuls read the f32 source rounded to bf16 as they
  // pack it (bit-identical). Only where the source stays alive as long anyway
  // (a param, or read again later), so no memory is held longer. CPU kernels
  // only; call after fuse_bf16_casts. Returns the casts dropped.
  size_t fold_bf16_casts();
  // Each ADD of a bias row (f32 [N] or [1, N], contiguous) to a 2-D MATMUL
  // result [M, N] of 2-D f32/f16/bf16 operands (a Linear: matmul(x, W.T()) + b)
  // becomes that MATMUL with the bias as a third source, when nothing else reads
  // the product (no other node of the context; not an output, input, param,
  // loss, checkpoint or gradient): the ADD node takes over the product's op and
  // operands and the product leaves the graph. The CPU GEMM adds the bias to C
  // as it stores it, bit-identical to the separate add. Meant for graphs only the
  // CPU backend runs (other backends leave such a MATMUL to the CPU kernels; its
  // backward rule gives the bias ADD's gradient). Call after the graph is
  // complete (backward included), before allocating it. Returns the adds fused.
  size_t fuse_matmul_bias();
  // Each ADD of a LAYER_NORM_BACK or RMS_NORM_BACK result s to another f32
  // tensor r of the same shape (the two gradients of a tensor read by a norm
  // and by something else, as a pre-norm block's residual stream is) becomes
  // that backward op with r as its last source (has_residual), when nothing
  // else reads s (as for fuse_matmul_bias): the kernel adds r to each dx row
  // as it stores it, bit-identical to the separate add. CPU kernels only; call
  // after the graph is complete, before allocating it. Returns the adds fused.
  size_t fuse_norm_residual();
  size_t size() const { return nodes_.size(); }
  std::string dump() const;

 private:
  void visit(TensorNode* out);
  void check_alive() const {
    if (life_.expired()) detail::fail_dead_context("graph");
  }
  std::vector<TensorNode*> nodes_;
  std::vector<TensorNode*> leafs_;
  std::unordered_set<const TensorNode*> seen_;
  std::unordered_map<const TensorNode*, TensorNode*> grads_;       // tensor -> gradient
  std::vector<std::pair<TensorNode*, TensorNode*>> accumulators_;  // param -> accumulator
  size_t n_forward_ = 0;
  // The nodes' Context token (a graph never mixes contexts: op builders refuse that).
  std::weak_ptr<const void> life_ = detail::immortal_life();
};

// ---------------------------------------------------------------------------
// Gradient checkpointing (torch.utils.checkpoint's trade: compute for memory).
// checkpoint(x) marks x (and returns it): a backward pass built afterwards keeps
// x and recomputes the forward nodes that lie between x and the previous
// checkpoints (or the leaves) from them, instead of keeping those activations
// alive; the graph allocator frees them after the forward pass. Nodes after the
// last checkpoint are not recomputed (backward needs them at once). Recomputed
// nodes repeat their op and parameters, so dropout draws the same mask. Mark
// before Graph::backward.
Tensor checkpoint(Tensor x);
// Marks checkpoints in forward graph g automatically and returns them: among
// its cut points (activations that are the only value live at their step) it
// picks about sqrt(count) - 1, so the segments between them hold about equal
// activation bytes (Chen et al., "Training deep nets with sublinear memory
// cost"). A graph without two cut points gets none.
std::vector<Tensor> auto_checkpoint(const Graph& g);

}  // namespace kiln
