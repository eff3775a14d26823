// What the graph rewrite tests (tests/opt/test_*_fusion.cpp, cast folding,
// bf16 gradient sums, GELU's bf16 input) check with: f32 results equal bit for
// bit, how many nodes of an op and dtype a graph holds, and a run of a graph
// on filled tensors.
#pragma once
#include <cstring>
#include <initializer_list>
#include <memory>
#include <vector>

#include "common/random_values.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln_test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline int nodes_of(const kiln::Graph& g, kiln::Op op, kiln::DType dt) {
  int n = 0;
  for (const kiln::TensorNode* t : g.nodes()) n += t->op == op && t->dtype == dt;
  return n;
}

// Builds the graph of `loss` (forward and backward) and runs a rewrite pass
// on it: true when the pass rewrote nothing (returned 0, same node list).
inline bool pass_leaves_alone(kiln::Tensor loss, size_t (kiln::Graph::*pass)()) {
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  const std::vector<kiln::TensorNode*> before = g.nodes();
  return (g.*pass)() == 0 && g.nodes() == before;
}

// Allocates ctx's tensors on a CpuBackend(threads), fills `ts` with
// uniform_floats (seeds 1, 2, ... in order), zeroes the gradients and runs g.
// The buffer holds the results.
inline std::unique_ptr<kiln::Buffer> run_filled(kiln::Context& ctx, kiln::Graph& g,
                                                std::initializer_list<kiln::Tensor> ts,
                                                int threads) {
  kiln::CpuBackend cpu(threads);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  uint32_t seed = 1;
  for (kiln::Tensor t : ts) t.set(uniform_floats(size_t(t.numel()), seed++));
  g.reset_grads();
  cpu.compute(g);
  return buf;
}

}  // namespace kiln_test
