// Internal to src/opt: the third part of an OptContext, what runs its program.
// The backends (its own CpuBackend or the caller's), the static buffer (params,
// gradients, optimizer state, inputs, hyper-parameters: every leaf, gradients
// first in the order the backward pass finishes them), the planned memory of
// the intermediates, and the phases run on it: forward, forward + backward
// (optionally pausing at cut points), the optimizer steps, the partial-batch
// tail. One backend runs spans of the program's graph; several run the phase
// graphs through schedulers.
#pragma once
#include <functional>
#include <memory>
#include <vector>

#include "kiln/ext/alloc.h"
#include "kiln/ext/sched.h"
#include "opt/step_program.h"

namespace kiln {

class GraphRunner {
 public:
  // `backends` empty: a CpuBackend of its own with n_threads.
  GraphRunner(const std::vector<Backend*>& backends, int n_threads);
  bool several() const { return backends_.size() > 1; }
  // The passes of `wanted` the program may get: those its one backend
  // supports; none with several (the phase graphs are copies taken before).
  GraphPasses passes(GraphPasses wanted) const;
  // Gives every leaf memory and plans the rest; the program must outlive this.
  void allocate(const StepProgram& prog, bool forward_only);

  void forward();
  void forward_with_tail();  // forward, then the partial-batch tail
  // Forward + backward. With `cuts` (ascending counts of prog.ready) and one
  // backend, pauses after each cut's gradients are final and calls on_cut(c).
  void backward(const std::vector<size_t>& cuts = {},
                const std::function<void(size_t)>& on_cut = {});
  void steps();

  Backend& backend() { return *backends_[0]; }
  Backend* backend_of(const TensorNode* t) const;
  const MemoryPlan& plan() const { return plan_; }
  size_t static_bytes() const { return static_bytes_; }

 private:
  void run(size_t begin, size_t end);  // a span of the program's graph, one backend
  const StepProgram* prog_ = nullptr;
  std::unique_ptr<Backend> own_backend_;
  std::vector<Backend*> backends_;
  std::unique_ptr<Buffer> static_buf_;
  size_t static_bytes_ = 0;
  // One backend: the graph's intermediates, and the tail's in a buffer of its own.
  std::unique_ptr<GraphAllocator> galloc_, tail_alloc_;
  MemoryPlan plan_;
  // Several backends: g_eval, g_accum and the forward graph with the tail share
  // nodes, so they share one scheduler (it re-plans when the phase changes); the
  // step graph reads pre-allocated tensors only and has a scheduler of its own,
  // so stepping never re-plans.
  std::unique_ptr<Scheduler> sched_, sched_opt_;
};

}  // namespace kiln
