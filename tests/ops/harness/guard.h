// Guard bytes around every tensor of a case, so the harness catches a kernel that
// writes outside its output (as ggml's test-backend-ops does with sentinels), and
// a node-by-node run that also catches a kernel changing its inputs.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {

class GuardedMemory {
 public:
  // Gives every tensor of ctx without memory a block of be's buffer type, with
  // guard regions (at least kGuardBytes, filled with a position-dependent
  // pattern) before the first block, between blocks and after the last. Tensor
  // bytes start zeroed, as with allocate_tensors. Only for host buffer types.
  static constexpr size_t kGuardBytes = 64;
  std::unique_ptr<Buffer> allocate(Context& ctx, Backend& be);

  // "" when every guard byte still holds its pattern, else which tensor's guard
  // was overwritten and how far from the tensor's end (or start).
  std::string check() const;

 private:
  struct Region {
    size_t begin, end;         // byte offsets in the buffer
    const TensorNode* before;  // tensor ending at `begin` (null for the first)
    const TensorNode* after;   // tensor starting at `end` (null for the last)
  };
  const unsigned char* base_ = nullptr;
  std::vector<Region> regions_;
};

// "node #id op [shape] 'name'", for reports.
std::string node_str(const TensorNode* n);

// Runs g's nodes on be one at a time (be must hold guarded host memory). After
// each node, every guard must be intact and, unless the op is ALIAS (it updates
// src0 in place by definition), the node's sources must hold the bytes they held
// before it ran. Returns "" or what went wrong, naming the node.
std::string run_checked(const Graph& g, Backend& be, const GuardedMemory& mem);

}  // namespace kiln::test
