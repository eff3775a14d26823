// The node-list edit every graph rewrite pass ends with (Graph::fuse_bf16_casts,
// fold_bf16_casts, fuse_matmul_bias): drop the nodes a pass made dead, insert
// the views it made right before their first reader, recount the forward part.
#pragma once
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/ext/tensor_node.h"

namespace kiln::detail {

// nodes without those in `gone`, each before[n] placed right before n (n kept
// unless gone); n_forward counts the result's nodes that came from (or were
// placed before) the first n_forward; `seen` forgets the dropped nodes.
inline void rewrite_node_list(
    std::vector<TensorNode*>& nodes, size_t& n_forward, std::unordered_set<const TensorNode*>& seen,
    const std::unordered_set<const TensorNode*>& gone,
    const std::unordered_map<const TensorNode*, std::vector<TensorNode*>>& before = {}) {
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
  }
  nodes = std::move(kept);
  n_forward = forward;
  for (const TensorNode* n : gone) seen.erase(n);
}

}  // namespace kiln::detail
