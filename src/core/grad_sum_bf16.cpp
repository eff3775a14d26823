// Graph::sum_bf16_gradients: a Linear's output gradient that its products
// read as bf16 is also summed over the batch for its bias gradient; the sum
// reads the bf16 copy instead (as PyTorch's autocast sums the bf16 gradient),
// so the f32 gradient has one reader left, the cast, and fuse_bf16_casts can
// make its producer store bf16: the f32 gradient is never written, and the
// products pack bf16 instead of rounding f32 twice.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"
#include "kiln/tensor.h"

namespace kiln {
namespace {

using detail::kRewritePinned;

// The gradient ops whose casts fuse_bf16_casts can fold (their kernels store bf16).
bool gradient_op(Op op) { return op == Op::GELU_BACK || op == Op::GELU_ERF_BACK; }

// A cast n = COPY to bf16 of a gradient s, directly or through reshapes
// (detail::bf16_cast_source).
struct GradCast {
  TensorNode* n = nullptr;
  TensorNode* s = nullptr;
  std::vector<TensorNode*> views;
};

bool grad_cast_of(TensorNode* n, GradCast& c) {
  std::vector<TensorNode*> views;
  TensorNode* s = detail::bf16_cast_source(n, views);
  if (!s || s->dtype != DType::f32 || s->is_view() || !s->is_contiguous() ||
      (s->flags & kRewritePinned) || !gradient_op(s->op) || s->ctx != n->ctx)
    return false;
  c = {n, s, std::move(views)};
  return true;
}

// A bias gradient's sum: an f32 SUM of x alone.
bool sums(const TensorNode* m, const TensorNode* x) {
  return m->op == Op::SUM && m->dtype == DType::f32 && m->n_src == 1 && m->src[0] == x &&
         !(m->flags & kRewritePinned);
}

}  // namespace

size_t Graph::sum_bf16_gradients() {
  check_alive();
  std::vector<GradCast> cands;
  std::unordered_map<const TensorNode*, int> readers;  // in the context, of each s and view
  for (TensorNode* n : nodes_) {
    GradCast c;
    if (!grad_cast_of(n, c) || !seen_.count(c.s)) continue;
    readers[c.s] = 0;
    for (const TensorNode* v : c.views) readers[v] = 0;
    cands.push_back(std::move(c));
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].s->ctx, readers);
  // The same count over this graph's nodes, and who the readers are.
  std::unordered_map<const TensorNode*, int> here;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> read_by;
  std::unordered_map<const TensorNode*, size_t> pos;
  for (size_t i = 0; i < nodes_.size(); ++i) {
    TensorNode* m = nodes_[i];
    pos[m] = i;
    auto note = [&](const TensorNode* x) {
      if (!x || !readers.count(x)) return;
      ++here[x];
      read_by[x].push_back(m);
    };
    for (int k = 0; k < m->n_src; ++k) note(m->src[k]);
    if (!(m->n_src > 0 && m->src[0] == m->view_src)) note(m->view_src);
  }

  size_t repointed = 0;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> views_before;
  std::unordered_set<const TensorNode*> moved;  // casts (and their views) to place earlier
  std::unordered_map<const TensorNode*, const TensorNode*> move_before;  // n -> first sum
  for (const GradCast& c : cands) {
    std::vector<const TensorNode*> chain = {c.s};
    chain.insert(chain.end(), c.views.begin(), c.views.end());
    std::vector<std::pair<TensorNode*, const TensorNode*>> found;  // (sum, what it reads)
    bool ok = true;
    for (const TensorNode* x : chain) {
      if (readers[x] != here[x]) ok = false;  // read outside this graph
      for (TensorNode* m : read_by[x]) {
        if (m == c.n || std::find(c.views.begin(), c.views.end(), m) != c.views.end()) continue;
        if (sums(m, x) && pos[m] >= n_forward_) found.emplace_back(m, x);
        else ok = false;
      }
    }
    if (!ok || found.empty()) continue;
    const TensorNode* first = found[0].first;
    for (auto& [m, x] : found) {
      if (pos[m] < pos[first]) first = m;
      if (x->shape == c.n->shape) {
        m->src[0] = c.n;
      } else {
        TensorNode* r = Tensor(c.n).reshape(x->shape).node();
        views_before[m].push_back(r);
        seen_.insert(r);
        m->src[0] = r;
      }
      ++repointed;
    }
    // The cast must now come before the sums: it reads only views of s, which
    // the sums read too, so it (and its views) can move up to the first one.
    if (pos[c.n] > pos[first]) {
      move_before[c.n] = first;
      moved.insert(c.n);
      for (const TensorNode* v : c.views)
        if (pos[v] > pos[first]) moved.insert(v);
    }
  }
  if (repointed == 0) return 0;
  if (!moved.empty()) {
    // Take the moved nodes out (keeping their order) and put each cast's group
    // right before its first sum.
    std::unordered_map<const TensorNode*, std::vector<TensorNode*>> group;  // first sum -> nodes
    std::vector<TensorNode*> kept;
    std::vector<TensorNode*> pending;  // moved views waiting for their cast
    for (TensorNode* m : nodes_) {
      if (!moved.count(m)) {
        kept.push_back(m);
        continue;
      }
      pending.push_back(m);
      if (auto it = move_before.find(m); it != move_before.end()) {
        auto& g = group[it->second];
        g.insert(g.end(), pending.begin(), pending.end());
        pending.clear();
      }
    }
    kept.insert(kept.end(), pending.begin(), pending.end());  // (none: views precede their cast)
    nodes_.clear();
    for (TensorNode* m : kept) {
      if (auto it = group.find(m); it != group.end())
        nodes_.insert(nodes_.end(), it->second.begin(), it->second.end());
      nodes_.push_back(m);
    }
  }
  detail::rewrite_node_list(nodes_, n_forward_, seen_, {}, views_before);
  return repointed;
}

}  // namespace kiln
