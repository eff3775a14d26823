// Internal to src/opt: the state of an OptContext (opt_context.cpp builds and
// runs it; checkpoint.cpp saves and loads it).
#pragma once
#include <memory>
#include <vector>

#include "kiln/alloc.h"
#include "kiln/opt.h"
#include "kiln/sched.h"

namespace kiln {

struct OptContext::Impl {
  OptConfig cfg;
  Tensor inputs, labels, outputs, loss, pred, correct;
  // The step's values per param group (AdamWHyper / SgdHyper layout), written
  // per step; the step nodes read hp_eff (hp, with the gradient scale times the
  // clipping factor when clipping).
  std::vector<Tensor> hp, hp_eff;
  std::vector<std::optional<float>> group_decay;
  std::vector<size_t> group_of;  // per param
  Tensor grad_norm;              // f32 [1] (clipping only)
  std::vector<Tensor> dropout_seeds;
  int64_t passes = 0;  // training forward passes run (dropout's step seed)
  std::vector<Tensor> params, grads;
  std::vector<Tensor> state_a, state_b;  // AdamW: m and v; SGD: momentum buffer (or none), -
  std::vector<Tensor> steps;             // the optimizer step nodes, one per param

  // One graph holds everything, in execution order: [0, n_fwd) forward,
  // [n_fwd, n_bwd) backward (ending in the gradient accumulations),
  // [n_bwd, size) the optimizer steps. With one backend the phases run as
  // spans of it; with several, through schedulers (graphs below).
  Graph graph;
  size_t n_fwd = 0, n_bwd = 0;

  std::unique_ptr<Backend> own_backend;
  std::vector<Backend*> backends;
  std::unique_ptr<Buffer> static_buf;  // leaves: params, grads, state, inputs, hp
  size_t static_bytes = 0;
  std::unique_ptr<GraphAllocator> galloc;  // one backend: the graph's intermediates
  MemoryPlan plan;
  // Several backends: g_eval and g_accum share nodes, so they share one scheduler
  // (it re-plans only when the phase changes); the step graph reads pre-allocated
  // tensors only and has a scheduler of its own, so stepping never re-plans.
  std::unique_ptr<Scheduler> sched, sched_opt;
  Graph g_eval, g_accum, g_opt;

  int64_t B = 0, logical = 0, k = 1;
  int64_t step = 0, epoch = 0, pending = 0;
  int64_t steps_per_epoch = 0, epochs = 0;
  ScheduleFn schedule;
  OptimizerParams last;

  // Data parallelism (cfg.parallel). `ready`: param indices in the order the
  // backward pass finishes their gradients, `ready_pos[i]` the graph position of
  // ready[i]'s accumulation; `cuts` from ParallelHook::attach; `notified`: grads
  // reported ready since the last step; `synced`: params broadcast.
  ParallelHook* par = nullptr;
  std::vector<size_t> ready, ready_pos, cuts;
  size_t notified = 0;
  bool synced = false;

  void build();
  void collect_params();
  void build_steps(Context& ctx);
  void allocate();
  void run_forward();
  void run_backward(bool before_step = false);  // forward + backward
  void sync_params();
  void write_checkpoint(const std::string& path, bool with_optimizer_state,
                        const std::vector<std::pair<std::string, GgufValue>>& extra) const;
  void attach_parallel();
  void run_step();
  double read_scalar(Tensor t) const;
  double partial_loss(int64_t samples, int64_t* n_correct) const;
  void zero_grads();
  void check_trainable() const;
};

}  // namespace kiln
