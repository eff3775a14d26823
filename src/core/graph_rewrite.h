// Shared by the graph rewrite passes (Graph::fuse_bf16_casts, fold_bf16_casts,
// fuse_matmul_bias, fuse_norm_residual): the flags that pin a node, the nodes
// Graph::grad hands out, counting a node's readers in the whole context, and the
// node-list edit every pass ends with (drop the nodes a pass made dead, insert
// the views it made right before their first reader, recount the forward part).
#pragma once
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::detail {

// Flags of a node that a rewrite must keep as it is (never fold it into
// another node or drop it): the program reads or writes it by name.
inline constexpr uint32_t kRewritePinned =
    kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc | kFlagCheckpoint;

// The nodes Graph::grad hands out (values of its gradient map): a rewrite that
// drops or reshapes one would leave grad() pointing at nothing.
template <class GradMap>
std::unordered_set<const TensorNode*> grad_node_set(const GradMap& grads) {
  std::unordered_set<const TensorNode*> s;
  for (const auto& [t, g] : grads) s.insert(g);
  return s;
}

// The memory owner s of x: x itself, or what x reads through up to two
// contiguous reshapes of s (a Linear flattens [B, T, C] and back; attention
// splits C into heads), those reshapes in `views` (x first); null when a view
// on the way is not such a reshape (or is pinned).
inline TensorNode* reshape_owner(TensorNode* x, std::vector<TensorNode*>& views) {
  views.clear();
  TensorNode* s = x;
  while (s->is_view()) {  // (each view's view_src is the memory's owner: s at the end)
    if (s->op != Op::RESHAPE || s->view_offs != 0 || s->n_src != 1 || !s->src[0] ||
        !s->is_contiguous() || (s->flags & kRewritePinned) || views.size() == 2)
      return nullptr;
    views.push_back(s);
    s = s->src[0];
  }
  for (const TensorNode* v : views)
    if (v->view_src != s) return nullptr;
  return s;
}

// The tensor a cast n = COPY to bf16 (contiguous, no view) converts: the
// memory owner s of its source (reshape_owner, the reshapes in `views`, n's
// source first); null when n is no such cast or s is not found.
inline TensorNode* bf16_cast_source(TensorNode* n, std::vector<TensorNode*>& views) {
  views.clear();
  if (n->op != Op::COPY || n->dtype != DType::bf16 || n->n_src != 1 || n->is_view() ||
      !n->is_contiguous() || !n->src[0])
    return nullptr;
  return reshape_owner(n->src[0], views);
}

// readers[x] += the number of nodes anywhere in ctx that read x, for every x
// already a key of readers (other graphs built from the same nodes, the
// partial-batch tail and recomputed segments read them too, not only the graph
// being rewritten). A view reads its memory owner through its src, so a view
// whose src is its owner counts once.
inline void count_context_readers(Context& ctx,
                                  std::unordered_map<const TensorNode*, int>& readers) {
  auto count = [&](const TensorNode* s) {
    if (!s) return;
    auto it = readers.find(s);
    if (it != readers.end()) ++it->second;
  };
  for (size_t i = 0; i < ctx.size(); ++i) {
    const TensorNode* c = ctx.node(i);
    for (int k = 0; k < c->n_src; ++k) count(c->src[k]);
    if (!(c->n_src > 0 && c->src[0] == c->view_src)) count(c->view_src);
  }
}

// nodes without those in `gone`, each before[n] placed right before n and each
// after[n] right after it (n kept unless gone); n_forward counts the result's
// nodes that came from (or were placed next to) the first n_forward; `seen`
// forgets the dropped nodes.
inline void rewrite_node_list(
    std::vector<TensorNode*>& nodes, size_t& n_forward, std::unordered_set<const TensorNode*>& seen,
    const std::unordered_set<const TensorNode*>& gone,
    const std::unordered_map<const TensorNode*, std::vector<TensorNode*>>& before = {},
    const std::unordered_map<const TensorNode*, std::vector<TensorNode*>>& after = {}) {
  std::vector<TensorNode*> kept;
  size_t forward = 0;
  for (size_t i = 0; i < nodes.size(); ++i) {
    TensorNode* n = nodes[i];
    const bool fwd = i < n_forward;
    if (auto it = before.find(n); it != before.end())
      for (TensorNode* v : it->second) {
        kept.push_back(v);
        forward += fwd;
      }
    if (gone.count(n)) continue;
    kept.push_back(n);
    forward += fwd;
    if (auto it = after.find(n); it != after.end())
      for (TensorNode* v : it->second) {
        kept.push_back(v);
        forward += fwd;
      }
  }
  nodes = std::move(kept);
  n_forward = forward;
  for (const TensorNode* n : gone) seen.erase(n);
}

}  // namespace kiln::detail
