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

using detail::kRewritePinned;

// n = ADD(s, r) or ADD(r, s): s a LAYER_NORM_BACK or RMS_NORM_BACK result
// without a residual yet, r any f32 tensor; all three of one shape. Both
// sources may be norm gradients (the last block's: x's gradient is ln_2's plus
// ln_f's, which c_proj's products read too): s[0] and s[1] are the two ways
// round, the second empty when only one fits.
struct NormResidualCandidate {
  TensorNode* n = nullptr;
  TensorNode* s[2] = {nullptr, nullptr};
  TensorNode* r[2] = {nullptr, nullptr};
};

bool has_residual(const TensorNode* s) {
  return s->op == Op::LAYER_NORM_BACK ? op_params<Op::LAYER_NORM_BACK>(*s).has_residual
                                      : op_params<Op::RMS_NORM_BACK>(*s).has_residual;
}

bool is_norm_back(const TensorNode* s, const TensorNode* n) {
  return (s->op == Op::LAYER_NORM_BACK || s->op == Op::RMS_NORM_BACK) && !s->is_view() &&
         s->dtype == DType::f32 && s->shape == n->shape && !(s->flags & kRewritePinned) &&
         s->ctx == n->ctx && s->n_src < kMaxSrc && !has_residual(s);
}

bool norm_residual_candidate_of(TensorNode* n, NormResidualCandidate& c) {
  if (n->op != Op::ADD || n->n_src != 2 || n->is_view() || n->dtype != DType::f32 ||
      !n->is_contiguous() || !n->src[0] || !n->src[1])
    return false;
  c = {n, {}, {}};
  int found = 0;
  for (int k = 0; k < 2; ++k) {
    TensorNode *s = n->src[k], *r = n->src[1 - k];
    if (s != r && is_norm_back(s, n) && r->dtype == DType::f32 && r->shape == n->shape) {
      c.s[found] = s;
      c.r[found++] = r;
    }
  }
  return found > 0;
}

}  // namespace

size_t Graph::fuse_norm_residual() {
  check_alive();
  std::vector<NormResidualCandidate> cands;
  std::unordered_map<const TensorNode*, int> readers;  // of each norm gradient s
  for (TensorNode* n : nodes_) {
    NormResidualCandidate c;
    if (!norm_residual_candidate_of(n, c)) continue;
    cands.push_back(c);
    for (TensorNode* s : c.s)
      if (s) readers[s] = 0;
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].n->ctx, readers);
  const auto grad_nodes = detail::grad_node_set(grads_);  // Graph::grad must keep finding them

  std::unordered_set<const TensorNode*> gone;
  for (const NormResidualCandidate& c : cands) {
    int k = 0;
    auto fits = [&](const TensorNode* s) {
      return s && seen_.count(s) && readers[s] == 1 && !grad_nodes.count(s) && !gone.count(s);
    };
    while (k < 2 && !fits(c.s[k])) ++k;
    if (k == 2) continue;
    // The ADD node becomes the norm's backward op with r as its last source;
    // its consumers, flags and memory stay as they were. (ADD's operands
    // commute exactly, so r + dx is the sum the ADD computed.)
    TensorNode* n = c.n;
    TensorNode* s = c.s[k];
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
    n->src[s->n_src] = c.r[k];
    n->n_src = s->n_src + 1;
    gone.insert(s);
  }
  if (gone.empty()) return 0;
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone);
  return gone.size();
}

}  // namespace kiln
