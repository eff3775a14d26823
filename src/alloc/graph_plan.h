// Internal: the graph allocator's plan. Planning is pure metadata in three steps:
//   1. liveness (plan_liveness): walk the nodes in order, count consumers, decide
//      in-place reuse; the result is a list of blocks, each with a size and the
//      interval of steps during which it must hold its contents;
//   2. placement (place_blocks): give every block an offset so blocks whose
//      intervals intersect never overlap;
//   3. GraphAllocator::alloc points the tensors at base + offset.
// In-place decisions depend only on consumer counts, never on offsets, so any
// placement of the blocks is valid: that lets step 2 try more than one strategy.
#pragma once
#include <cstddef>
#include <vector>

#include "kiln/ext/alloc.h"

namespace kiln::alloc_detail {

// Tensors that live to the end of the graph.
inline constexpr uint32_t kKeepFlags =
    kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc;

struct Block {
  size_t size = 0;
  int first = 0;  // first step it holds data (-1: before the first node, for leaves)
  int last = 0;   // last step it must keep its data (n_steps: to the end)
  size_t offset = 0;
};

// One event of the walk, in order: at each step allocations come before frees
// (a node's output is written while its inputs are still read).
struct Event {
  int block;
  bool alloc;
};

struct Plan {
  std::vector<Block> blocks;
  std::vector<Event> events;
  std::vector<std::pair<TensorNode*, int>> tensors;  // tensors placed here -> block
  std::vector<TensorNode*> views;                    // view/alias nodes to point at their owner
  MemoryPlan stats;                                  // sizes filled by place_blocks
};

// The tensor whose memory t uses (t itself unless t is a view or an alias).
inline TensorNode* owner_of(TensorNode* t) {
  while (t->view_src) t = t->view_src;
  return t;
}

// Step 1. `own` is the allocator's current buffer (tensors in it are re-planned).
Plan plan_liveness(const NodeList& list, const BufferType& type, const Buffer* own,
                   const GraphAllocatorOptions& opt);

// Step 2: sets every block's offset and plan.stats (buffer size, lower bound, strategy).
void place_blocks(Plan& plan, size_t alignment, Placement how);

}  // namespace kiln::alloc_detail
