// Graph::fuse_bf16_casts: folds a bf16 cast into the op that produces its
// source, so the op's kernel rounds on store instead of a second pass over
// memory (and a second thread-pool dispatch) doing it.
#include <algorithm>
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
    case Op::GELU_ERF_BACK:
    case Op::CROSS_ENTROPY_BACK:
    case Op::MATMUL: return true;
    default: return false;
  }
}

using detail::kRewritePinned;

// A cast n = COPY to bf16 of the op's result s, directly or through
// reshapes (detail::bf16_cast_source).
struct CastCandidate {
  TensorNode* n = nullptr;
  std::vector<TensorNode*> views;  // the reshapes between s and n (n's source first)
  TensorNode* s = nullptr;
};

bool cast_candidate_of(TensorNode* n, CastCandidate& c) {
  std::vector<TensorNode*> views;
  TensorNode* s = detail::bf16_cast_source(n, views);
  if (!s) return false;
  if (s->dtype != DType::f32 || s->numel() != n->numel() || s->is_view() || !s->is_contiguous() ||
      (s->flags & kRewritePinned) || !stores_bf16(s->op) || s->ctx != n->ctx)
    return false;
  if (s->op == Op::MATMUL && is_quantized(s->src[1]->dtype)) return false;  // qmatmul stores f32
  if (!views.empty()) {
    // The op runs with n's shape: LayerNorm's rows must stay rows; an
    // elementwise op reads its sources through reshapes, so they must be
    // contiguous and of s's shape (no broadcasting).
    const int nd = s->shape.ndim(), vd = n->shape.ndim();
    if (s->op == Op::LAYER_NORM) {
      if (nd == 0 || vd == 0 || s->shape[nd - 1] != n->shape[vd - 1]) return false;
    } else if (s->op == Op::CROSS_ENTROPY_BACK) {
      if (n->shape != s->shape) return false;  // its rows are the logits' rows
    } else if (s->op == Op::MATMUL) {
      // The kernel writes 2-D factors' [M, N] product into any contiguous shape.
      if (nd != 2 || s->src[0]->shape.ndim() != 2 || s->src[1]->shape.ndim() != 2) return false;
    } else {
      // (A GELU's input may be bf16: Graph::bf16_gelu_inputs.)
      for (int k = 0; k < s->n_src; ++k)
        if (!s->src[k] || s->src[k]->shape != s->shape || !s->src[k]->is_contiguous() ||
            (s->src[k]->dtype != DType::f32 && s->src[k]->dtype != DType::bf16))
          return false;
    }
  }
  c = {n, std::move(views), s};
  return true;
}

}  // namespace

size_t Graph::fuse_bf16_casts() {
  check_alive();
  std::vector<CastCandidate> cands;
  std::unordered_map<const TensorNode*, int> readers;  // of each s and view
  for (TensorNode* n : nodes_) {
    CastCandidate c;
    if (!cast_candidate_of(n, c) || !seen_.count(c.s)) continue;
    readers[c.s] = 0;
    for (const TensorNode* v : c.views) readers[v] = 0;
    cands.push_back(std::move(c));
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].s->ctx, readers);

  std::unordered_map<const TensorNode*, TensorNode*> became;  // s and its views -> the cast
  size_t fused = 0;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> views_before;  // new views
  for (const CastCandidate& c : cands) {
    const bool viewed = !c.views.empty();
    // s is read by the first view (or n) and, through view_src, by every
    // view of a view (count_context_readers).
    const int s_readers = 1 + int(std::count_if(c.views.begin(), c.views.end(),
                                                [&](auto* v) { return v->src[0] != v->view_src; }));
    if (readers[c.s] != s_readers ||
        std::any_of(c.views.begin(), c.views.end(), [&](auto* v) { return readers[v] != 1; }))
      continue;
    TensorNode* n = c.n;
    n->op = c.s->op;
    n->params = c.s->params;
    n->n_src = c.s->n_src;
    n->src = c.s->src;
    if (viewed && c.s->op != Op::LAYER_NORM && c.s->op != Op::MATMUL &&
        c.s->op != Op::CROSS_ENTROPY_BACK) {
      for (int k = 0; k < n->n_src; ++k) {
        TensorNode* r = Tensor(c.s->src[k]).view(n->shape).node();
        n->src[size_t(k)] = r;
        views_before[n].push_back(r);
        seen_.insert(r);
      }
    }
    became[c.s] = n;
    for (TensorNode* v : c.views) became[v] = n;
    ++fused;
  }
  if (became.empty()) return 0;
  // Graph::grad of t whose gradient was s or one of its views now returns the
  // bf16 cast, or a reshape of it to that gradient's shape (placed after it).
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> views_after;
  for (auto& [t, g] : grads_) {
    auto it = became.find(g);
    if (it == became.end()) continue;
    TensorNode* n = it->second;
    if (g->shape == n->shape) {
      g = n;
      continue;
    }
    TensorNode* r = Tensor(n).reshape(g->shape).node();
    views_after[n].push_back(r);
    seen_.insert(r);
    g = r;
  }
  std::unordered_set<const TensorNode*> gone;  // s and its views
  for (const auto& [x, n] : became) gone.insert(x);
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone, views_before, views_after);
  return fused;
}

}  // namespace kiln
