// The scheduler: runs one Graph across several backends (docs/design.md, principles 5-7).
//
//   kiln::BlasBackend blas(4);   // matmul only
//   kiln::CpuBackend cpu(4);     // everything
//   kiln::Scheduler sched({&blas, &cpu});   // first = preferred
//   sched.alloc(graph);          // assign, split, allocate (once)
//   x.set(batch);                // per step: write the inputs ...
//   sched.compute(graph);        // ... and run the splits in order
//   std::puts(sched.dump().c_str());
//
// Assignment, node by node in execution order:
//   1. views go where the tensor they view lives; an in-place op (ACCUMULATE)
//      where the tensor it updates lives;
//   2. a node reading a pre-allocated tensor (memory the user allocated, in some
//      backend's buffer) runs on the first backend using that memory that
//      supports it;
//   3. otherwise on the first backend that supports the op;
//   4. expansion: a node whose inputs and consumers all live in memory of one
//      other type moves there when a backend of that memory supports it, which
//      saves copying its inputs over and its output back;
// leaves the scheduler allocates go where their first consumer runs.
//
// Consecutive nodes on one backend form a split. A split reads an input that
// lives in memory its backend cannot use through a copy made by the scheduler
// just before the split runs (host memory is shared: backends whose buffers are
// host memory, like CPU and BLAS, never copy between each other). The user's
// graph is never modified: splits, copies and the nodes that read copies (the
// scheduler's own copies of the consuming nodes) live in the scheduler, so one
// graph can be scheduled and run any number of times.
//
// Memory: one GraphAllocator per distinct buffer type of the backends, all
// planning the same execution order, so a tensor's memory is freed after its
// last consumer on any backend. Pre-allocated tensors stay where they are; the
// scheduler never moves them. alloc() on another graph re-plans the scheduler's
// buffers: tensors that must outlive one graph (params, optimizer state shared
// by a training and an evaluation graph) should be pre-allocated. A graph
// belongs to one scheduler at a time (another scheduler would take the tensors
// the first one placed for pre-allocated ones).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {

struct SchedulerOptions {
  GraphAllocatorOptions alloc;  // for every buffer type's GraphAllocator
  bool expand = true;           // step 4 of the assignment (see above)
};

// One split of the current schedule, for inspection (tests, tools).
struct SplitInfo {
  int backend = 0;                  // index into the scheduler's backends
  int first = 0, last = 0;          // graph node indices of its first and last node
  std::vector<TensorNode*> nodes;   // the user's nodes it computes, in order
  std::vector<TensorNode*> copied;  // tensors copied into its backend's memory before it runs
};

class Scheduler {
 public:
  // Backends in order of preference; they must outlive the scheduler.
  explicit Scheduler(std::vector<Backend*> backends, SchedulerOptions opt = {});
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Sizes the buffers for `g` (the largest graph) without assigning memory, so
  // later alloc() calls of graphs that fit never reallocate.
  void reserve(const Graph& g);
  // Assigns every node of `g` to a backend, splits, and gives every tensor of `g`
  // memory. Allocating the same graph again keeps every tensor where it was (so
  // the values of leaves and gradient accumulators survive). Returns true when a
  // buffer had to be (re)allocated.
  bool alloc(const Graph& g);
  // Runs `g`: every split's copies, then its nodes on its backend. Calls alloc(g)
  // first when `g` is not the graph of the last alloc().
  void compute(const Graph& g);

  // The splits as text: index, backend, node range, copied inputs, and each
  // node with the backend and memory of its sources.
  std::string dump() const;

  const std::vector<Backend*>& backends() const;
  std::vector<SplitInfo> splits() const;
  size_t n_splits() const;
  size_t n_copies() const;  // tensors copied per run
  // The backend a tensor of the current schedule runs on / lives in (null if
  // the tensor is not part of it).
  Backend* backend_of(const TensorNode* t) const;
  Backend* backend_of(Tensor t) const { return backend_of(t.node()); }
  // Bytes of the scheduler's buffers of that backend's buffer type (shared by
  // backends with the same buffer type).
  size_t buffer_size(const Backend& b) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
