// Running an OptContext's program (see graph_runner.h).
#include "opt/graph_runner.h"

#include <algorithm>
#include <unordered_set>

#include "kiln/cpu.h"

namespace kiln {

GraphRunner::GraphRunner(const std::vector<Backend*>& backends, int n_threads) {
  if (backends.empty()) {
    own_backend_ = std::make_unique<CpuBackend>(n_threads);
    backends_ = {own_backend_.get()};
    return;
  }
  for (Backend* b : backends)
    if (!b) fail("opt", "a backend is null");
  backends_ = backends;
}

GraphPasses GraphRunner::passes(GraphPasses wanted) const {
  return several() ? GraphPasses() : backends_[0]->supported_passes(wanted);
}

void GraphRunner::allocate(const StepProgram& prog, bool forward_only) {
  prog_ = &prog;
  Backend& be0 = *backends_[0];
  // Leaves live for the whole run: one static buffer of the preferred backend's
  // memory (tensors the user allocated already keep their memory).
  BufferType& bt = be0.buffer_type();
  // Gradients first, one after the other in the order backward finishes them,
  // so a data-parallel hook reduces runs of them in place (no packing).
  // Multi-tensor steps: the flat gradients take that place (the gradients are
  // slices of it at the same offsets), and slices get memory from their owners.
  std::vector<TensorNode*> pending;
  std::unordered_set<const TensorNode*> queued;
  for (const StepProgram::FlatSlice& sl : prog.slices) queued.insert(sl.member);
  TensorAllocator measure(bt);
  auto queue = [&](TensorNode* l) {
    if (l->data || l->numel() == 0 || !queued.insert(l).second) return;
    pending.push_back(l);
    measure.alloc(l);
  };
  if (prog.multi) queue(prog.grads_flat.node());
  for (size_t i : prog.ready) queue(prog.grads[i].node());
  for (TensorNode* l : prog.graph.leafs()) queue(l);
  for (TensorNode* l : prog.forward_with_tail.leafs()) queue(l);  // the sample mask
  static_bytes_ = measure.high_water();
  static_buf_ = bt.alloc(std::max<size_t>(static_bytes_, bt.alignment()));
  static_buf_->clear(0);  // gradients and moments start at zero
  TensorAllocator place(*static_buf_);
  for (TensorNode* l : pending) place.place(l);
  for (const StepProgram::FlatSlice& sl : prog.slices) {
    TensorNode* m = sl.member;
    if (m->numel() == 0) continue;
    KILN_ASSERT(sl.owner->data && sl.offset + m->nbytes() <= sl.owner->nbytes());
    m->data = static_cast<char*>(sl.owner->data) + sl.offset;
    m->buffer = sl.owner->buffer;
    m->buffer->track(m);
  }

  if (!several()) {
    auto check = [&](const TensorNode* n) {
      if (!be0.supports_op(n))
        fail("opt", "backend ", be0.name(), " does not support ", op_name(n->op), " (node ",
             n->label(), "): give several backends to run through the scheduler");
    };
    for (const TensorNode* n : prog.graph.nodes()) check(n);
    for (const TensorNode* n : prog.tail) check(n);
    galloc_ = std::make_unique<GraphAllocator>(bt);
    galloc_->alloc(prog.graph);
    plan_ = galloc_->plan();
    if (!prog.tail.empty()) {
      // The tail reads the forward pass's outputs where the main plan put them.
      tail_alloc_ = std::make_unique<GraphAllocator>(bt);
      tail_alloc_->alloc(NodeList(std::span<TensorNode* const>(prog.tail)));
    }
    return;
  }
  sched_ = std::make_unique<Scheduler>(backends_);
  if (forward_only) {
    sched_->alloc(prog.g_eval);
    return;
  }
  sched_->reserve(prog.g_accum);
  sched_->alloc(prog.g_accum);
  sched_opt_ = std::make_unique<Scheduler>(backends_);
  sched_opt_->alloc(prog.g_opt);
}

void GraphRunner::run(size_t begin, size_t end) {
  backends_[0]->compute(
      std::span<TensorNode* const>(prog_->graph.nodes().data() + begin, end - begin));
}

void GraphRunner::forward() {
  if (galloc_) run(0, prog_->n_fwd);
  else sched_->compute(prog_->g_eval);
}

void GraphRunner::forward_with_tail() {
  if (galloc_) {
    run(0, prog_->n_fwd);
    backends_[0]->compute(std::span<TensorNode* const>(prog_->tail));
  } else {
    sched_->compute(prog_->forward_with_tail);
  }
}

void GraphRunner::backward(const std::vector<size_t>& cuts,
                           const std::function<void(size_t)>& on_cut) {
  const StepProgram& p = *prog_;
  if (galloc_ && cuts.size() > 1) {
    // Pause after each group of finished gradients so the caller (a
    // data-parallel hook) reduces them while the rest of the backward pass runs.
    size_t begin = 0;
    for (size_t c : cuts) {
      const size_t end = c == p.ready.size() ? p.n_bwd : p.ready_pos[c - 1] + 1;
      run(begin, end);
      on_cut(c);
      begin = end;
    }
  } else if (galloc_) {
    run(0, p.n_bwd);
  } else {
    sched_->compute(p.g_accum);
  }
}

void GraphRunner::steps() {
  if (galloc_) run(prog_->n_bwd, prog_->graph.size());
  else sched_opt_->compute(prog_->g_opt);
}

Backend* GraphRunner::backend_of(const TensorNode* t) const {
  if (!sched_) {
    for (const TensorNode* n : prog_->graph.nodes())
      if (n == t) return backends_[0];
    return nullptr;
  }
  if (Backend* b = sched_->backend_of(t)) return b;
  return sched_opt_ ? sched_opt_->backend_of(t) : nullptr;
}

}  // namespace kiln
