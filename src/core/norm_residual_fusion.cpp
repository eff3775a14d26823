// Graph::fuse_norm_residual: folds the ADD that sums a norm's input gradient
// with the other gradient of the same tensor (a pre-norm block's residual
// stream: x feeds both the norm and the residual add) into the norm's backward
// kernel, which adds that gradient to each dx row it writes: one pass over
// [rows, D] and one thread-pool dispatch fewer per norm.
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

constexpr uint32_t kPinned =
    kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc | kFlagCheckpoint;

// n = ADD(s, r) or ADD(r, s): s a LAYER_NORM_BACK or RMS_NORM_BACK result
// without a residual yet, r any f32 tensor; all three of one shape.
struct Candidate {
  TensorNode* n = nullptr;
  TensorNode* s = nullptr;
  TensorNode* r = nullptr;
};

bool has_residual(const TensorNode* s) {
  return s->op == Op::LAYER_NORM_BACK ? op_params<Op::LAYER_NORM_BACK>(*s).has_residual
                                      : op_params<Op::RMS_NORM_BACK>(*s).has_residual;
}

bool is_norm_back(const TensorNode* s, const TensorNode* n) {
  return (s->op == Op::LAYER_NORM_BACK || s->op == Op::RMS_NORM_BACK) && !s->is_view() &&
         s->dtype == DType::f32 && s->shape == n->shape && !(s->flags & kPinned) &&
         s->ctx == n->ctx && s->n_src < kMaxSrc && !has_residual(s);
}

bool candidate_of(TensorNode* n, Candidate& c) {
  if (n->op != Op::ADD || n->n_src != 2 || n->is_view() || n->dtype != DType::f32 ||
      !n->is_contiguous() || !n->src[0] || !n->src[1])
    return false;
  for (int k = 0; k < 2; ++k) {
    TensorNode *s = n->src[k], *r = n->src[1 - k];
    if (s != r && is_norm_back(s, n) && r->dtype == DType::f32 && r->shape == n->shape) {
      c = {n, s, r};
      return true;
    }
  }
  return false;
}

}  // namespace

size_t Graph::fuse_norm_residual() {
  check_alive();
  std::vector<Candidate> cands;
  std::unordered_map<const TensorNode*, int> readers;  // of each norm gradient s
  for (TensorNode* n : nodes_) {
    Candidate c;
    if (!candidate_of(n, c) || !seen_.count(c.s)) continue;
    cands.push_back(c);
    readers[c.s] = 0;
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].s->ctx, readers);
  std::unordered_set<const TensorNode*> grad_nodes;  // Graph::grad must keep finding them
  for (const auto& [t, g] : grads_) grad_nodes.insert(g);

  std::unordered_set<const TensorNode*> gone;
  for (const Candidate& c : cands) {
    if (readers[c.s] != 1 || grad_nodes.count(c.s)) continue;
    // The ADD node becomes the norm's backward op with r as its last source;
    // its consumers, flags and memory stay as they were. (ADD's operands
    // commute exactly, so r + dx is the sum the ADD computed.)
    TensorNode* n = c.n;
    TensorNode* s = c.s;
    n->op = s->op;
    if (s->op == Op::LAYER_NORM_BACK) {
      LayerNormParams p = op_params<Op::LAYER_NORM_BACK>(*s);
      p.has_residual = true;
      detail::set_params(*n, p);
    } else {
      RmsNormParams p = op_params<Op::RMS_NORM_BACK>(*s);
      p.has_residual = true;
      detail::set_params(*n, p);
    }
    n->src = s->src;
    n->src[s->n_src] = c.r;
    n->n_src = s->n_src + 1;
    gone.insert(s);
  }
  if (gone.empty()) return 0;
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone);
  return gone.size();
}

}  // namespace kiln
