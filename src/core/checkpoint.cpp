// Gradient checkpointing: marking checkpoints (by hand or automatically) and
// the recomputation the backward pass builds from them (core/recompute.h).
#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "core/recompute.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {

Tensor checkpoint(Tensor x) {
  if (!x.defined()) fail("checkpoint", "x is an undefined tensor");
  detail::set_flags(x, kFlagCheckpoint);
  return x;
}

namespace {

// Tensors the graph allocator keeps anyway and rules may read as they are.
constexpr uint32_t kKept = kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc;

bool is_leaf(const TensorNode* n) { return n->op == Op::NONE; }

}  // namespace

namespace detail {

Recompute::Recompute(std::span<TensorNode* const> forward) {
  // A checkpointed view keeps its memory owner (and the views between) too.
  std::unordered_set<const TensorNode*> checkpoints;
  for (TensorNode* n : forward) {
    if (!(n->flags & kFlagCheckpoint)) continue;
    for (TensorNode* t = n; t; t = t->is_view() ? t->src[0] : nullptr) checkpoints.insert(t);
  }
  if (checkpoints.empty()) return;
  // Consumers come after their sources: walking backwards, a node is known to
  // be recomputed (or a checkpoint) before its sources are looked at.
  for (size_t k = forward.size(); k-- > 0;) {
    TensorNode* n = forward[k];
    if (!checkpoints.count(n) && !recomputed_.count(n)) continue;
    for (int i = 0; i < n->n_src; ++i) {
      TensorNode* s = n->src[i];
      if (!s || is_leaf(s) || checkpoints.count(s) || (s->flags & kKept) ||
          op_kind(s->op) == OpKind::ALIAS)
        continue;
      recomputed_.insert(s);
    }
  }
}

TensorNode* Recompute::of(TensorNode* n) {
  if (!n || !recomputed_.count(n)) return n;
  if (auto it = copies_.find(n); it != copies_.end()) return it->second;
  // Copies sources before consumers without recursion (segments may be long).
  std::vector<TensorNode*> stack{n};
  while (!stack.empty()) {
    TensorNode* t = stack.back();
    if (copies_.count(t)) {
      stack.pop_back();
      continue;
    }
    bool ready = true;
    for (int i = 0; i < t->n_src; ++i) {
      TensorNode* s = t->src[i];
      if (s && recomputed_.count(s) && !copies_.count(s)) {
        stack.push_back(s);
        ready = false;
      }
    }
    if (ready) {
      copies_[t] = copy(t);
      stack.pop_back();
    }
  }
  return copies_.at(n);
}

TensorNode* Recompute::copy(TensorNode* n) {
  auto mapped = [&](TensorNode* s) {
    auto it = s ? copies_.find(s) : copies_.end();
    return it == copies_.end() ? s : it->second;
  };
  TensorNode* c = n->ctx->new_node(n->dtype, n->shape, n->op);
  c->stride = n->stride;
  c->params = n->params;
  c->n_src = n->n_src;
  for (int i = 0; i < n->n_src; ++i) c->src[i] = mapped(n->src[i]);
  c->view_src = mapped(n->view_src);
  c->view_offs = n->view_offs;
  if (!n->name.empty()) c->name = n->name + " (recomputed)";
  return c;
}

}  // namespace detail

// ---------------------------------------------------------------------------
// Automatic checkpoints.

std::vector<Tensor> auto_checkpoint(const Graph& g) {
  const std::vector<TensorNode*>& nodes = g.nodes();
  const size_t n_fwd = g.n_forward();
  // Activations: nodes that depend on a graph input. Nodes computed from params
  // and constants alone (transposed weights, masks) do not split the graph.
  std::unordered_map<const TensorNode*, size_t> pos;
  std::vector<char> varying(n_fwd, 0);
  for (size_t k = 0; k < n_fwd; ++k) {
    TensorNode* n = nodes[k];
    pos[n] = k;
    for (int i = 0; i < n->n_src; ++i) {
      const TensorNode* s = n->src[i];
      if (!s) continue;
      auto it = pos.find(s);
      if ((is_leaf(s) && (s->flags & kFlagInput)) || (it != pos.end() && varying[it->second]))
        varying[k] = 1;
    }
  }
  // last[k]: position of the last forward consumer of activation k.
  std::vector<size_t> last(n_fwd, 0);
  for (size_t k = 0; k < n_fwd; ++k)
    for (int i = 0; i < nodes[k]->n_src; ++i) {
      auto it = nodes[k]->src[i] ? pos.find(nodes[k]->src[i]) : pos.end();
      if (it != pos.end()) last[it->second] = std::max(last[it->second], k);
    }
  // Cut points: activations that are the only value live across their
  // position (nothing earlier is still read later). Weights: the bytes of the
  // activations computed since the previous cut.
  std::vector<size_t> cuts;
  std::vector<double> bytes_before;  // activation bytes up to and including each cut
  double total = 0;
  size_t reach = 0;  // furthest consumer of activations before position k
  for (size_t k = 0; k < n_fwd; ++k) {
    TensorNode* n = nodes[k];
    if (!varying[k]) continue;
    if (!n->is_view()) total += double(n->nbytes());
    const bool cut = reach <= k && last[k] > k && !n->is_view() && !(n->flags & kKept) &&
                     op_kind(n->op) == OpKind::COMPUTE;
    if (cut) {
      cuts.push_back(k);
      bytes_before.push_back(total);
    }
    reach = std::max(reach, last[k]);
  }
  std::vector<Tensor> chosen;
  if (cuts.size() < 2) return chosen;
  // About sqrt(candidates) segments of about equal activation bytes: memory is
  // the checkpoints plus one segment recomputed at a time (Chen et al. 2016).
  const size_t segments = size_t(std::lround(std::sqrt(double(cuts.size()))));
  size_t from = 0;
  for (size_t j = 1; j < segments; ++j) {
    const double target = total * double(j) / double(segments);
    size_t best = from;
    for (size_t c = from; c < cuts.size(); ++c)
      if (std::fabs(bytes_before[c] - target) < std::fabs(bytes_before[best] - target)) best = c;
    if (!chosen.empty() && chosen.back().node() == nodes[cuts[best]]) continue;
    chosen.push_back(checkpoint(Tensor(nodes[cuts[best]])));
    from = best + 1;
    if (from == cuts.size()) break;
  }
  return chosen;
}

}  // namespace kiln
