// Graph::fuse_bf16_casts: folds a bf16 cast into the op that produces its
// source, so the op's kernel rounds on store instead of a second pass over
// memory (and a second thread-pool dispatch) doing it.
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

// Ops whose CPU kernels store a bf16 dst (rounding as a COPY does).
bool stores_bf16(Op op) {
  switch (op) {
    case Op::LAYER_NORM:
    case Op::GELU:
    case Op::GELU_ERF:
    case Op::GELU_BACK:
    case Op::GELU_ERF_BACK: return true;
    default: return false;
  }
}

using detail::kRewritePinned;

// A cast n = COPY(v) to bf16, where v is the op's result s itself or a
// contiguous reshape of it (a Linear flattens [B, T, C] to [B*T, C]).
struct Candidate {
  TensorNode* n = nullptr;
  TensorNode* v = nullptr;  // the reshape between s and n, or null
  TensorNode* s = nullptr;
};

bool candidate_of(TensorNode* n, Candidate& c) {
  if (n->op != Op::COPY || n->dtype != DType::bf16 || n->n_src != 1 || n->is_view() ||
      !n->is_contiguous() || !n->src[0])
    return false;
  TensorNode* s = n->src[0];
  TensorNode* v = nullptr;
  if (s->is_view()) {
    if (s->op != Op::RESHAPE || s->view_offs != 0 || s->n_src != 1 || s->src[0] != s->view_src ||
        !s->is_contiguous() || (s->flags & kRewritePinned))
      return false;
    v = s;
    s = v->view_src;
  }
  if (s->dtype != DType::f32 || s->numel() != n->numel() || s->is_view() || !s->is_contiguous() ||
      (s->flags & kRewritePinned) || !stores_bf16(s->op) || s->ctx != n->ctx)
    return false;
  if (v) {
    // The op runs with n's shape: LayerNorm's rows must stay rows; an
    // elementwise op reads its sources through reshapes, so they must be
    // contiguous and of s's shape (no broadcasting).
    const int nd = s->shape.ndim(), vd = n->shape.ndim();
    if (s->op == Op::LAYER_NORM) {
      if (nd == 0 || vd == 0 || s->shape[nd - 1] != n->shape[vd - 1]) return false;
    } else {
      for (int k = 0; k < s->n_src; ++k)
        if (!s->src[k] || s->src[k]->shape != s->shape || !s->src[k]->is_contiguous() ||
            s->src[k]->dtype != DType::f32)
          return false;
    }
  }
  c = {n, v, s};
  return true;
}

}  // namespace

size_t Graph::fuse_bf16_casts() {
  check_alive();
  std::vector<Candidate> cands;
  std::unordered_map<const TensorNode*, int> readers;  // of each s and v
  for (TensorNode* n : nodes_) {
    Candidate c;
    if (!candidate_of(n, c) || !seen_.count(c.s)) continue;
    cands.push_back(c);
    readers[c.s] = 0;
    if (c.v) readers[c.v] = 0;
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].s->ctx, readers);
  const auto grad_nodes = detail::grad_node_set(grads_);

  std::unordered_map<const TensorNode*, TensorNode*> replaced;  // s -> the cast it became
  std::unordered_set<const TensorNode*> gone;                   // s and v
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> views_before;  // new views
  for (const Candidate& c : cands) {
    if (readers[c.s] != 1 || (c.v && readers[c.v] != 1)) continue;
    // Graph::grad of t whose gradient was s then returns the bf16 cast: only
    // when the shapes agree.
    if (c.v && (grad_nodes.count(c.s) || grad_nodes.count(c.v))) continue;
    TensorNode* n = c.n;
    n->op = c.s->op;
    n->params = c.s->params;
    n->n_src = c.s->n_src;
    n->src = c.s->src;
    if (c.v && c.s->op != Op::LAYER_NORM) {
      for (int k = 0; k < n->n_src; ++k) {
        TensorNode* r = Tensor(c.s->src[k]).view(n->shape).node();
        n->src[size_t(k)] = r;
        views_before[n].push_back(r);
        seen_.insert(r);
      }
    }
    replaced[c.s] = n;
    gone.insert(c.s);
    if (c.v) gone.insert(c.v);
  }
  if (gone.empty()) return 0;
  for (auto& [t, g] : grads_)
    if (auto it = replaced.find(g); it != replaced.end()) g = it->second;
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone, views_before);
  return replaced.size();
}

}  // namespace kiln
