// The program of an OptContext (see step_program.h): forward, backward and
// optimizer nodes in one graph, and the partial-batch tail.
#include "opt/step_program.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/ops.h"

namespace kiln {

void StepProgram::build(const OptConfig& cfg, const LossMetrics& lm, const ScheduleFn& schedule,
                        bool phase_graphs, GraphPasses passes, BufferType& bt) {
  const char* op = "opt";
  optimizer = cfg.optimizer;
  graph = Graph::forward(lm.loss);
  graph.expand(lm.outputs);
  if (lm.correct.defined()) {
    graph.expand(lm.pred);
    graph.expand(lm.correct);
  }
  bool uses_inputs = false;
  for (TensorNode* l : graph.leafs()) uses_inputs |= l == lm.inputs.node();
  if (!uses_inputs) fail(op, "the loss does not depend on inputs ", lm.inputs.label());
  if (lm.splittable()) {
    forward_with_tail = graph;
    forward_with_tail.expand(lm.partial_loss);
    if (lm.partial_correct.defined()) forward_with_tail.expand(lm.partial_correct);
    const auto& all = forward_with_tail.nodes();
    tail.assign(all.begin() + std::ptrdiff_t(graph.size()), all.end());
  }
  if (phase_graphs) g_eval = graph;
  if (cfg.forward_only) {
    n_fwd = n_bwd = graph.size();
    for (TensorNode* l : graph.leafs())
      if (l->flags & kFlagParam) params.emplace_back(l);
    if (!cfg.params.empty()) params = cfg.params;
    else if (cfg.model) params = cfg.model->parameters();
    state.resize(params.size());
    passes_run = run_graph_passes(graph, passes);
    n_fwd = n_bwd = graph.size();
    return;
  }
  if (cfg.checkpointing) auto_checkpoint(graph);
  graph.backward(lm.loss);
  // The optimizer nodes built below read gradient accumulators only, never a
  // cast's source or a product: the graph is complete as far as the fusions are
  // concerned.
  passes_run = run_graph_passes(graph, passes);
  n_fwd = graph.n_forward();
  n_bwd = graph.size();
  collect_params(cfg);
  for (const Tensor& p : params) grads.push_back(graph.grad(p));
  find_ready_order();
  if (phase_graphs) g_accum = graph;
  build_steps(cfg, schedule, phase_graphs, bt);
}

// Params: given (alone or in groups), the model's, or every param with a gradient.
void StepProgram::collect_params(const OptConfig& cfg) {
  const char* op = "opt";
  if (!cfg.params.empty() && !cfg.groups.empty()) fail(op, "give params or groups, not both");
  std::vector<Tensor> given = cfg.params;
  if (!cfg.groups.empty()) {
    for (size_t g = 0; g < cfg.groups.size(); ++g) {
      if (cfg.groups[g].params.empty()) fail(op, "param group ", g, " is empty");
      for (const Tensor& p : cfg.groups[g].params) {
        given.push_back(p);
        group_of.push_back(g);
      }
      group_decay.push_back(cfg.groups[g].weight_decay);
    }
  } else if (given.empty() && cfg.model) {
    // The model's trainable params: frozen ones get no gradient and no state.
    given = cfg.model->trainable_parameters();
  }
  if (given.empty()) {
    for (TensorNode* l : graph.leafs())
      if ((l->flags & kFlagParam) && !(l->flags & kFlagGradAcc) && graph.grad(Tensor(l)).defined())
        params.emplace_back(l);
  } else {
    std::unordered_set<const TensorNode*> seen;
    for (const Tensor& p : given) {
      if (!p.defined()) fail(op, "a param is an undefined tensor");
      if (!p.has_flag(kFlagParam))
        fail(op, "tensor ", p.label(), " is not a param: create it with Context::param");
      if (!seen.insert(p.node()).second) fail(op, "param ", p.label(), " is listed twice");
      if (!p.requires_grad())
        fail(op, "param ", p.label(),
             " is frozen (requires_grad false): unfreeze it or leave it out");
      if (!graph.grad(p).defined())
        fail(op, "param ", p.label(), " ", p.shape().str(), " does not affect the loss");
      params.push_back(p);
    }
  }
  if (params.empty()) fail(op, "the loss depends on no param");
  for (const Tensor& p : params)
    if (p.dtype() != f32)
      fail(op, "param ", p.label(), " is ", dtype_name(p.dtype()),
           ": optimizers update f32 params");
  if (group_decay.empty()) {
    group_decay.emplace_back();
    group_of.assign(params.size(), 0);
  }
}

// One hp tensor per group (laid out as AdamWHyper / SgdHyper); with clipping,
// hp_eff = hp * mask, where the mask is 1 but at grad_scale, which it holds
// min(1, max/(norm + 1e-6)): the steps' gradient scale includes the factor.
void StepProgram::build_steps(const OptConfig& cfg, const ScheduleFn& schedule, bool phase_graphs,
                              BufferType& bt) {
  if (cfg.clip_grad_norm < 0 || !std::isfinite(cfg.clip_grad_norm))
    fail("opt", "clip_grad_norm must be >= 0 and finite, got ", cfg.clip_grad_norm);
  Context& ctx = params[0].ctx();
  const bool adamw = optimizer == OptimizerType::adamw;
  const int64_t n_hp = adamw ? hyper_floats<AdamWHyper> : hyper_floats<SgdHyper>;
  const int64_t i_gs =
      adamw ? hyper_grad_scale_index<AdamWHyper>() : hyper_grad_scale_index<SgdHyper>();
  multi = can_go_multi(cfg);
  if (multi) {
    hp_all = ctx.tensor(f32, {int64_t(group_decay.size()), n_hp}, "opt.hp");
    hp_all_eff = hp_all;
    build_flat_state(bt);
  } else {
    for (size_t g = 0; g < group_decay.size(); ++g) {
      hp.push_back(ctx.tensor(f32, {n_hp},
                              group_decay.size() == 1 ? "opt.hp" : "opt.hp." + std::to_string(g)));
      hp_eff.push_back(hp.back());
    }
  }
  if (cfg.clip_grad_norm > 0) {
    // The gradient the step applies is grad_scale * accumulator. Multi: one
    // reduction over the flat gradients (their padding stays zero).
    Tensor sq;
    if (multi) {
      sq = sum(sqr(grads_flat)).reshape({1});
    } else {
      for (const Tensor& gr : grads) {
        Tensor s = sum(sqr(gr)).reshape({1});
        sq = sq.defined() ? sq + s : s;
      }
    }
    const Tensor gs = multi ? hp_all.reshape({hp_all.numel()}).narrow(0, i_gs, 1)  // group 0's
                            : hp[0].narrow(0, i_gs, 1);
    grad_norm = (sqrt(sq) * gs).set_name("opt.grad_norm");
    detail::set_flags(grad_norm, kFlagOutput);
    Tensor factor = clamp(full(ctx, {1}, cfg.clip_grad_norm) / (grad_norm + 1e-6f), 0.0f, 1.0f);
    std::vector<Tensor> parts;
    if (i_gs > 0) parts.push_back(ones(ctx, {i_gs}));
    parts.push_back(factor);
    if (i_gs + 1 < n_hp) parts.push_back(ones(ctx, {n_hp - i_gs - 1}));
    Tensor mask = parts.size() == 1 ? factor : concat(parts, 0);
    if (multi) hp_all_eff = hp_all * mask;  // [groups, n] * [n]: one node
    for (size_t g = 0; g < hp.size(); ++g) hp_eff[g] = hp[g] * mask;
  }
  if (multi) {
    build_multi_steps(bt, phase_graphs);
    if (grad_norm.defined()) {
      graph.expand(grad_norm);
      if (phase_graphs) g_opt.expand(grad_norm);
    }
    return;
  }
  // A momentum buffer only when the schedule's first step uses momentum.
  const bool momentum = !adamw && schedule(StepInfo{}).sgd.momentum != 0.0f;
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    const std::string base = p.name().empty() ? "param" + std::to_string(i) : p.name();
    Tensor h = hp_eff[group_of[i]];
    OptimizerState st;
    Tensor s;
    if (adamw) {
      st.m = ctx.tensor(f32, p.shape(), base + ".opt.m");
      st.v = ctx.tensor(f32, p.shape(), base + ".opt.v");
      s = adamw_step(p, grads[i], st.m, st.v, h);
    } else {
      if (momentum) st.buf = ctx.tensor(f32, p.shape(), base + ".opt.buf");
      s = sgd_step(p, grads[i], st.buf, h);
    }
    state.push_back(st);
    steps.push_back(s);
    graph.expand(s);
    if (phase_graphs) g_opt.expand(s);
  }
  if (grad_norm.defined()) {
    graph.expand(grad_norm);
    if (phase_graphs) g_opt.expand(grad_norm);
  }
}

// Multi-tensor steps need AdamW, f32 gradient accumulators that are leaves
// without memory (the flat owner gives it), and params that are whole leaves.
bool StepProgram::can_go_multi(const OptConfig& cfg) const {
  if (!cfg.multi_tensor || optimizer != OptimizerType::adamw) return false;
  for (size_t i = 0; i < params.size(); ++i) {
    const TensorNode *p = params[i].node(), *g = grads[i].node();
    if (p->is_view() || !p->is_contiguous() || (p->data && !p->buffer)) return false;
    if (g->op != Op::NONE || g->dtype != f32 || g->data || !g->is_contiguous()) return false;
  }
  return true;
}

// The gradients' layout of before (first in the static buffer, in ready
// order, each block rounded as the allocator rounds it) becomes the layout of
// the flat gradients, m and v: a param's state lies at its gradient's offset.
void StepProgram::build_flat_state(BufferType& bt) {
  Context& ctx = params[0].ctx();
  TensorAllocator measure(bt);
  std::vector<size_t> off(params.size());
  for (size_t i : ready) off[i] = measure.alloc(grads[i].node());
  const int64_t n = int64_t((measure.high_water() + 3) / 4);
  grads_flat = ctx.tensor(f32, {n}, "opt.grads");
  m_flat = ctx.tensor(f32, {n}, "opt.m");
  v_flat = ctx.tensor(f32, {n}, "opt.v");
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const std::string base = p.name().empty() ? "param" + std::to_string(i) : p.name();
    OptimizerState st;
    st.m = ctx.tensor(f32, p.shape(), base + ".opt.m");
    st.v = ctx.tensor(f32, p.shape(), base + ".opt.v");
    slices.push_back({grads[i].node(), grads_flat.node(), off[i]});
    slices.push_back({st.m.node(), m_flat.node(), off[i]});
    slices.push_back({st.v.node(), v_flat.node(), off[i]});
    state.push_back(st);
  }
}

// One step node per buffer of params (params without memory: a flat owner of
// their own) and per kMaxAdamWSegments of them; a param's segment row is
// (its element offset in the flat param, its state's, numel, group).
void StepProgram::build_multi_steps(BufferType& bt, bool phase_graphs) {
  Context& ctx = params[0].ctx();
  std::vector<Buffer*> bufs;  // in order of first appearance; nullptr: no memory yet
  std::vector<std::vector<size_t>> of_buf;
  for (size_t i = 0; i < params.size(); ++i) {
    Buffer* b = params[i].node()->buffer;
    auto it = std::find(bufs.begin(), bufs.end(), b);
    if (it == bufs.end()) {
      bufs.push_back(b);
      of_buf.emplace_back();
      it = bufs.end() - 1;
    }
    of_buf[size_t(it - bufs.begin())].push_back(i);
  }
  std::vector<size_t> state_off(params.size());
  for (const FlatSlice& sl : slices)
    if (sl.owner == grads_flat.node())
      for (size_t i = 0; i < params.size(); ++i)
        if (grads[i].node() == sl.member) state_off[i] = sl.offset;
  for (size_t k = 0; k < bufs.size(); ++k) {
    const std::vector<size_t>& idx = of_buf[k];
    std::vector<size_t> p_off(params.size());
    Tensor flat;
    std::string name = "opt.params";
    if (bufs.size() > 1) {  // appended, not "." + to_string(k): GCC 12's false -Wrestrict
      name += '.';
      name += std::to_string(k);
    }
    if (!bufs[k]) {
      TensorAllocator measure(bt);
      for (size_t i : idx) p_off[i] = measure.alloc(params[i].node());
      flat = ctx.tensor(f32, {int64_t((measure.high_water() + 3) / 4)}, name);
      for (size_t i : idx) slices.push_back({params[i].node(), flat.node(), p_off[i]});
    } else {
      // A cover of the params' memory in their buffer (it may hold other
      // tensors between them: the step writes the segments only).
      uintptr_t lo = UINTPTR_MAX, hi = 0;
      for (size_t i : idx) {
        const TensorNode* p = params[i].node();
        lo = std::min(lo, uintptr_t(p->data));
        hi = std::max(hi, uintptr_t(p->data) + p->nbytes());
      }
      for (size_t i : idx) p_off[i] = uintptr_t(params[i].node()->data) - lo;
      flat = ctx.tensor(f32, {int64_t((hi - lo) / 4)}, name);
      flat.node()->data = reinterpret_cast<void*>(lo);
      flat.node()->buffer = bufs[k];
      bufs[k]->track(flat.node());  // detached with the params if their buffer goes
    }
    // Rows ascending by state offset (the kernels' binary search).
    std::vector<size_t> order = idx;
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return state_off[a] < state_off[b]; });
    for (size_t first = 0; first < order.size(); first += size_t(kMaxAdamWSegments)) {
      const size_t last = std::min(order.size(), first + size_t(kMaxAdamWSegments));
      std::vector<int32_t> rows;
      for (size_t r = first; r < last; ++r) {
        const size_t i = order[r];
        for (size_t x : {p_off[i] / 4, state_off[i] / 4, size_t(params[i].numel()), group_of[i]})
          rows.push_back(int32_t(x));
      }
      Tensor table = ctx.tensor(i32, {int64_t(last - first), 4},
                                "opt.segs." + std::to_string(seg_tables.size()));
      seg_tables.push_back(table);
      seg_rows.push_back(std::move(rows));
      Tensor s = adamw_step_multi(flat, grads_flat, m_flat, v_flat, hp_all_eff, table);
      steps.push_back(s);
      graph.expand(s);
      if (phase_graphs) g_opt.expand(s);
    }
  }
}

void StepProgram::write_constants() {
  for (size_t k = 0; k < seg_tables.size(); ++k)
    seg_tables[k].set(std::span<const int32_t>(seg_rows[k]));
}

// The order the backward pass finishes gradients: where each accumulation runs.
void StepProgram::find_ready_order() {
  std::unordered_map<const TensorNode*, size_t> index_of;
  for (size_t i = 0; i < grads.size(); ++i) index_of[grads[i].node()] = i;
  for (size_t k = n_fwd; k < n_bwd; ++k) {
    const TensorNode* n = graph.nodes()[k];
    if (n->op != Op::ACCUMULATE && n->op != Op::MATMUL_ACC) continue;
    auto it = index_of.find(n->view_src);
    if (it == index_of.end()) continue;
    ready.push_back(it->second);
    ready_pos.push_back(k);
  }
  KILN_ASSERT(ready.size() == grads.size());
}

void StepProgram::write_hyper(const OptimizerParams& p, int64_t step, float grad_scale) {
  if (multi) {  // every group's row, one upload
    std::vector<float> all;
    for (size_t g = 0; g < group_decay.size(); ++g) {
      AdamWParams q = p.adamw;
      if (group_decay[g]) q.weight_decay = *group_decay[g];
      const auto h = hyper_values(adamw_hyper(q, step + 1, grad_scale));
      all.insert(all.end(), h.begin(), h.end());
    }
    hp_all.set(std::span<const float>(all));
    return;
  }
  for (size_t g = 0; g < hp.size(); ++g) {
    OptimizerParams q = p;
    if (group_decay[g]) q.adamw.weight_decay = q.sgd.weight_decay = *group_decay[g];
    if (optimizer == OptimizerType::adamw) {
      const auto h = hyper_values(adamw_hyper(q.adamw, step + 1, grad_scale));
      hp[g].set(std::span<const float>(h));
    } else {
      const auto h = hyper_values(sgd_hyper(q.sgd, step == 0, grad_scale));
      hp[g].set(std::span<const float>(h));
    }
  }
}

void StepProgram::zero_grads() {
  if (multi) return grads_flat.fill_zero();  // one fill (the padding is zero anyway)
  for (Tensor& g : grads) g.fill_zero();
}

}  // namespace kiln
