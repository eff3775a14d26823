// MemoryPlan: what the graph allocator (kiln/ext/alloc.h) planned for a graph's
// buffer. A plain report, readable by programs (OptContext::memory_plan()).
#pragma once
#include <cstddef>

namespace kiln {

// Figures of one plan (bytes, including alignment padding).
struct MemoryPlan {
  size_t buffer_size = 0;  // the buffer the plan needs
  size_t total_size = 0;   // sum of every planned tensor's block (no reuse at all)
  // Largest sum of blocks live at one execution step, with the same liveness and
  // in-place decisions: no placement of these blocks can need less.
  size_t lower_bound = 0;
  size_t n_tensors = 0;       // tensors given a block (views and external ones excluded)
  size_t n_inplace = 0;       // nodes that took over their src0's block
  size_t n_steps = 0;         // nodes walked
  const char* strategy = "";  // placement used: "best-fit", "by-size", "by-end", "by-start"
  size_t best_fit_size = 0;   // what the online best-fit placement alone needed
};

}  // namespace kiln
