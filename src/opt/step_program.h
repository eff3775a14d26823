// Internal to src/opt: the second part of an OptContext, the program it runs.
// One graph in execution order: [0, n_fwd) forward, [n_fwd, n_bwd) backward
// (ending in the gradient accumulations), [n_bwd, size) the optimizer steps
// (with clipping, the gradient norm first). Besides it, the partial-batch tail
// (LossMetrics::partial_*) as nodes run after the forward span. The program
// also owns what the steps read and write: the params, their gradients and
// optimizer state, and one hyper-parameter tensor per param group.
#pragma once
#include <optional>
#include <vector>

#include "kiln/opt.h"
#include "opt/loss_metrics.h"

namespace kiln {

struct StepProgram {
  Graph graph;
  size_t n_fwd = 0, n_bwd = 0;
  // The forward graph followed by the partial-batch tail; tail = its nodes
  // after the forward ones (empty when the loss cannot be split).
  Graph forward_with_tail;
  std::vector<TensorNode*> tail;
  // The phases as graphs of their own, for schedulers (several backends only):
  // forward, forward + backward, and the optimizer nodes alone.
  Graph g_eval, g_accum, g_opt;

  OptimizerType optimizer = OptimizerType::adamw;
  std::vector<Tensor> params, grads;
  std::vector<OptimizerState> state;  // per param
  std::vector<Tensor> steps;  // the optimizer step nodes: one per param, or per segment table
  // The step's values per param group (AdamWHyper / SgdHyper layout), written
  // per step; the step nodes read hp_eff (hp, with the gradient scale times the
  // clipping factor when clipping).
  std::vector<Tensor> hp, hp_eff;
  std::vector<std::optional<float>> group_decay;
  std::vector<size_t> group_of;  // per param
  Tensor grad_norm;              // f32 [1] (clipping only)

  // Multi-tensor AdamW (OptConfig::multi_tensor; docs/design.md): the
  // gradients and the moments are slices of flat owners laid out alike (the
  // gradients' old places: first, in ready order), params without memory
  // slices of a flat owner of their own, params with memory reached through a
  // flat cover of their buffer. One ADAMW_STEP_MULTI per segment table; every
  // group's values in one hp tensor [groups, n] (hp, hp_eff stay empty).
  bool multi = false;
  struct FlatSlice {
    TensorNode* member;  // a leaf given memory inside owner's, at offset bytes
    TensorNode* owner;
    size_t offset;
  };
  std::vector<FlatSlice> slices;  // placed by GraphRunner::allocate
  Tensor grads_flat, m_flat, v_flat, hp_all, hp_all_eff;
  std::vector<Tensor> seg_tables;              // i32 [S, 4] each
  std::vector<std::vector<int32_t>> seg_rows;  // their values, written once allocated
  // Param indices in the order the backward pass finishes their gradients, and
  // the graph position of each one's accumulation.
  std::vector<size_t> ready, ready_pos;

  // The graph passes run on `graph` (kiln/graph_passes.h).
  GraphPasses passes_run;

  // Builds the whole program from the loss (and the phase graphs when
  // `phase_graphs`); `schedule` tells whether SGD keeps a momentum buffer (its
  // step-0 momentum). `passes` (checked, and only those the backend supports;
  // empty with several backends: the phase graphs are copies taken before
  // them) run on the complete graph. Throws kiln::Error "[opt] ...".
  // `bt`: the static buffer's type (the flat layouts use its alignment).
  void build(const OptConfig& cfg, const LossMetrics& lm, const ScheduleFn& schedule,
             bool phase_graphs, GraphPasses passes, BufferType& bt);
  // Writes what is constant once memory exists (the segment tables).
  void write_constants();
  bool trains() const { return n_bwd > n_fwd || !steps.empty(); }
  // Writes every group's hp tensor for optimizer step `step` (0-based).
  void write_hyper(const OptimizerParams& p, int64_t step, float grad_scale);
  void zero_grads();

 private:
  void collect_params(const OptConfig& cfg);
  void build_steps(const OptConfig& cfg, const ScheduleFn& schedule, bool phase_graphs,
                   BufferType& bt);
  bool can_go_multi(const OptConfig& cfg) const;
  void build_flat_state(BufferType& bt);
  void build_multi_steps(BufferType& bt, bool phase_graphs);
  void find_ready_order();
};

}  // namespace kiln
