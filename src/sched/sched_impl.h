// Internal: the scheduler's own structures (kiln/ext/sched.h). A Schedule is built
// from a graph in two steps and never touches the graph's nodes:
//   1. assign (assign.cpp): every tensor -> a backend index;
//   2. split (split.cpp): runs of nodes per backend, the copies each run needs,
//      the scheduler's own copies of nodes that read a copy ("shadows"), and the
//      execution order the graph allocators plan.
#pragma once
#include <deque>
#include <functional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::sched_detail {

// The tensor whose memory t uses (t itself unless t is a view or an alias).
inline TensorNode* owner_of(const TensorNode* t) {
  while (t->view_src) t = t->view_src;
  return const_cast<TensorNode*>(t);
}

// Can a backend whose memory is `b` read tensors in memory `a` directly? Host
// memory is one address space, whatever BufferType made it.
inline bool same_memory(const BufferType* a, const BufferType* b) {
  return a == b || (a->is_host() && b->is_host());
}

struct Copy {
  TensorNode* from;  // the tensor read (contiguous: a source, or a source's memory owner)
  TensorNode* to;    // the scheduler's tensor in the split backend's memory
};

struct Split {
  int backend = 0;
  int first = 0, last = 0;              // graph node indices
  std::vector<TensorNode*> user_nodes;  // the graph's compute/alias nodes, in order
  std::vector<TensorNode*> run;         // what the backend computes: user nodes or shadows
  std::vector<Copy> copies;
  std::vector<TensorNode*>
      copy_views;  // views of copies (non-contiguous sources), after the copies
};

struct Schedule {
  std::vector<TensorNode*> nodes, leafs;  // the graph's, to recognise it again

  // --- assignment (assign.cpp) ---
  std::unordered_map<const TensorNode*, int> where;    // tensor -> backend index
  std::unordered_set<const TensorNode*> preallocated;  // memory owners in user buffers

  // --- splits (split.cpp) ---
  std::vector<Split> splits;
  std::deque<TensorNode> own;  // copies, views of copies, shadows (stable addresses)
  std::vector<std::pair<TensorNode*, const TensorNode*>> shadows;  // shadow -> user node
  std::unordered_map<const TensorNode*, int> slot_of;  // tensors the allocators place -> slot
  std::vector<TensorNode*> plan_nodes;                 // execution order for the allocators
  size_t n_copies = 0;

  void clear() { *this = Schedule(); }
};

struct Env {
  const std::vector<Backend*>& backends;
  const std::vector<int>& slot_of_backend;              // backend index -> allocator slot
  std::function<bool(const Buffer*)> scheduler_buffer;  // memory the scheduler placed
  bool expand = true;
};

// Step 1. Throws kiln::Error when some node has no backend that can run it.
void assign(Schedule& s, const Env& c);
// Step 2 (after assign).
void split(Schedule& s, const Env& c);

// Scheduler::dump() (dump.cpp).
std::string dump_schedule(const Schedule& s, const Env& c);

// The memory a tensor lives in (after assign).
const BufferType* memory_of(const Schedule& s, const Env& c, const TensorNode* t);

}  // namespace kiln::sched_detail
