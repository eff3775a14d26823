// The backward-rule interface. Each differentiable op in kiln/ops.def has a rule
// `void backward_<ENUM>(GradCtx&)` defined next to its builder in src/core/ops/.
// Rules are written with kiln's own ops, so the backward pass is an ordinary graph.
#pragma once
#include "kiln/ext/op_params.h"
#include "kiln/tensor.h"

namespace kiln::detail {

class Recompute;

class GradCtx {
 public:
  // `re`: with gradient checkpointing, where rules read recomputed tensors.
  GradCtx(TensorNode* node, Tensor grad, const bool* needs, Recompute* re = nullptr)
      : node_(node), grad_(grad), needs_(needs), re_(re) {}
  // The forward node and its sources (recomputed copies under checkpointing).
  Tensor out() const;
  Tensor src(int i) const;
  int n_src() const { return node_->n_src; }
  // The forward node's parameters (kiln/ext/op_params.h): g.params<Op::SCALE>().mul.
  template <Op op>
  op_params_t<op> params() const {
    return op_params<op>(*node_);
  }
  Tensor grad() const { return grad_; }          // dLoss/dOut, shape of out()
  bool needs(int i) const { return needs_[i]; }  // does src i want a gradient?
  // Contributes dLoss/dSrc_i. g must have src i's shape (use sum_to after
  // broadcasting). A rule may contribute to the same source more than once (an op
  // that reads one tensor twice); the contributions are summed, as are those of
  // several consumers (by the caller).
  void add(int i, Tensor g);
  Tensor added(int i) const { return added_[i]; }

 private:
  TensorNode* node_;
  Tensor grad_;
  const bool* needs_;
  Recompute* re_;
  Tensor added_[kMaxSrc];
};

using BackwardFn = void (*)(GradCtx&);

#define KILN_BACKWARD_0(e)
#define KILN_BACKWARD_1(e) void backward_##e(GradCtx& g);
#define KILN_OP(e, family, kind, inplace, grad) KILN_BACKWARD_##grad(e)
#include "kiln/ops.def"
#undef KILN_OP
#undef KILN_BACKWARD_0
#undef KILN_BACKWARD_1

// acc += g, the accumulation of a param's gradient g into its accumulator acc
// (an ALIAS node viewing acc): MATMUL_ACC when g is a 2-D product (or its
// transpose) that nothing else reads (`g_shared` false), else ACCUMULATE.
// Defined with matmul's rule (src/core/ops/matmul.cpp).
TensorNode* accumulate_grad(TensorNode* acc, Tensor g, bool g_shared);

// The rule table (nullptr for ops without gradient). Tests may replace an entry to
// prove the op-test harness catches a wrong rule.
BackwardFn& backward_rule(Op op);

}  // namespace kiln::detail
