// What the graph rewrite tests (tests/opt/test_*_fusion.cpp, cast folding,
// bf16 gradient sums) check with: f32 results equal bit for bit, and how many
// nodes of an op and dtype a graph holds.
#pragma once
#include <cstring>
#include <vector>

#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln_test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline int nodes_of(const kiln::Graph& g, kiln::Op op, kiln::DType dt) {
  int n = 0;
  for (const kiln::TensorNode* t : g.nodes()) n += t->op == op && t->dtype == dt;
  return n;
}

}  // namespace kiln_test
