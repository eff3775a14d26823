// Internal to src/opt: an OptContext is the composition of three parts, each in
// its own file: what it measures (loss_metrics.h), the program it runs
// (step_program.h) and what runs it (graph_runner.h). The Impl holds them with
// the counters of a run and the data-parallel bookkeeping; opt_context.cpp is
// the public surface, checkpoint.cpp saves and loads, fit.cpp drives epochs.
#pragma once
#include <memory>
#include <vector>

#include "kiln/opt.h"
#include "opt/graph_runner.h"
#include "opt/loss_metrics.h"
#include "opt/step_program.h"

namespace kiln {

struct OptContext::Impl {
  OptConfig cfg;
  LossMetrics lm;
  StepProgram prog;
  std::unique_ptr<GraphRunner> runner;

  std::vector<Tensor> dropout_seeds;
  int64_t passes = 0;  // training forward passes run (dropout's step seed)
  int64_t B = 0, logical = 0, k = 1;
  int64_t step = 0, epoch = 0, pending = 0;
  int64_t steps_per_epoch = 0, epochs = 0;
  ScheduleFn schedule;
  OptimizerParams last;

  // Data parallelism (cfg.parallel): `cuts` from ParallelHook::attach;
  // `notified`: grads reported ready since the last step; `synced`: params
  // broadcast.
  ParallelHook* par = nullptr;
  std::vector<size_t> cuts;
  size_t notified = 0;
  bool synced = false;

  void attach_parallel();
  void sync_params();
  void run_forward(bool with_tail = false);
  void run_backward(bool before_step = false);  // forward + backward
  void run_step();
  void zero_grads();
  double read_scalar(Tensor t) const;
  void check_trainable() const;
  void write_checkpoint(const std::string& path, bool with_optimizer_state,
                        const std::vector<std::pair<std::string, GgufValue>>& extra) const;

  int rank() const { return par ? par->rank() : 0; }
  int world_size() const { return par ? par->size() : 1; }
};

// What the training layer itself (fit, tests) reads of a context beyond its
// public surface.
struct OptContextInternals {
  static OptContext::Impl& of(OptContext& o) { return *o.impl_; }
  static const OptContext::Impl& of(const OptContext& o) { return *o.impl_; }
};

}  // namespace kiln
