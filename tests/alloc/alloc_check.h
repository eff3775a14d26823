// Test helpers for the graph allocator: an overlap checker that derives liveness
// from the graph alone (not from the allocator's bookkeeping), and a generator of
// random graphs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"

namespace alloc_test {

// Checks the memory of an allocated graph. Liveness, derived independently:
// a tensor (memory owner: views and aliases resolve through src[0] to the tensor
// they alias) is live from its step (leaves: before step 0) to the last step of a
// node reading it or a view of it; leaves and tensors flagged input/output/param/
// loss/grad-acc (or having a view so flagged) live to the end. Any two owners
// placed in `buf` whose live intervals intersect must not share a byte, except a
// node and the source it legally ran in place over (inplace op, src0 resolves to
// the source, exact same bytes, the source's last use is that node, and no other
// source of the node reads them). Returns "" or the first violation found.
std::string check_overlaps(const kiln::Graph& g, const kiln::Buffer& buf);

struct RandomGraph {
  std::unique_ptr<kiln::Context> ctx;
  kiln::Graph graph;
  std::vector<kiln::Tensor> leaves;   // inputs, params and plain leaves (to fill)
  std::vector<kiln::Tensor> outputs;  // what the test compares
  kiln::Tensor loss;                  // defined for graphs with a backward pass
  std::vector<kiln::Tensor> grads;    // gradient accumulators
};

// A random graph: elementwise and in-place-able ops, views (reshape, narrow,
// permute, expand), matmuls, reductions, softmax, concat, copies, multi-consumer
// nodes and several outputs. With `backward`, only differentiable ops on params
// and a scalar loss, plus the backward pass.
RandomGraph make_random_graph(uint64_t seed, bool backward);

// Deterministic values for every leaf of a random graph.
void fill_leaves(const RandomGraph& rg, uint64_t seed);

// The bytes of a tensor's elements in row-major order (works on views).
std::vector<uint8_t> bytes_of(kiln::Tensor t);

}  // namespace alloc_test
