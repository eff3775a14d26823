// OptContext: builds the loss, forward, backward and optimizer graphs once and
// allocates them statically (docs/design.md, principle 7). Per step: the caller uploads
// a batch, the context writes the step's hyper-parameters and computes.
#include <cmath>
#include <unordered_map>
#include <unordered_set>

#include "kiln/cpu.h"
#include "kiln/ops.h"
#include "opt/opt_context_impl.h"

namespace kiln {

namespace {

bool is_leaf(Tensor t) { return t.op() == Op::NONE; }

}  // namespace

// ---------------------------------------------------------------------------
// Building.

void OptContext::Impl::build() {
  const char* op = "opt";
  if (!cfg.inputs.defined()) fail(op, "inputs is an undefined tensor");
  if (!cfg.outputs.defined()) fail(op, "outputs is an undefined tensor");
  if (!is_leaf(cfg.inputs))
    fail(op, "inputs ", cfg.inputs.label(), " must be a leaf (Context::input)");
  if (cfg.inputs.ndim() < 1) fail(op, "inputs ", cfg.inputs.label(), " needs a batch dim");
  inputs = cfg.inputs;
  outputs = cfg.outputs;
  B = inputs.size(0);
  Context& ctx = inputs.ctx();
  if (&outputs.ctx() != &ctx) fail(op, "inputs and outputs come from different contexts");

  // Loss and labels.
  labels = cfg.labels;
  if (labels.defined() && !is_leaf(labels))
    fail(op, "labels ", labels.label(), " must be a leaf (Context::input)");
  switch (cfg.loss) {
    case LossKind::cross_entropy:
      if (outputs.ndim() != 2 || outputs.size(0) != B)
        fail(op, "cross-entropy needs logits [", B, ", classes] but outputs is ",
             outputs.shape().str());
      if (!labels.defined()) labels = ctx.input(i32, {B}, "labels");
      loss = cross_entropy(outputs, labels);
      break;
    case LossKind::mse:
      if (!labels.defined()) labels = ctx.input(f32, outputs.shape(), "labels");
      loss = mse_loss(outputs, labels);
      break;
    case LossKind::user:
      if (!cfg.user_loss.defined()) fail(op, "LossKind::user needs OptConfig::user_loss");
      loss = cfg.user_loss;
      break;
  }
  if (loss.numel() != 1 || loss.dtype() != f32)
    fail(op, "the loss must be a one-element f32 tensor, got ", dtype_name(loss.dtype()), " ",
         loss.shape().str());
  if (labels.defined() && (labels.ndim() < 1 || labels.size(0) != B))
    fail(op, "labels ", labels.label(), " ", labels.shape().str(), " must have the batch size ", B,
         " of inputs ", inputs.shape().str(), " as first dim");
  loss.set_name("loss");

  // Accuracy: argmax of [B, C] outputs against class ids (or one-hot rows).
  if (cfg.loss != LossKind::mse && labels.defined() && outputs.ndim() == 2 && outputs.size(1) > 1) {
    pred = argmax(outputs, -1).set_name("pred");
    if (labels.dtype() == i32 && labels.ndim() == 1) correct = count_equal(pred, labels);
    else if (labels.ndim() == 2 && labels.shape() == outputs.shape())
      correct = count_equal(pred, argmax(labels, -1));
    if (correct.defined()) correct.set_name("n_correct");
  }

  // Forward + backward.
  graph = Graph::forward(loss);
  graph.expand(outputs);
  if (correct.defined()) {
    graph.expand(pred);
    graph.expand(correct);
  }
  bool uses_inputs = false;
  for (TensorNode* l : graph.leafs()) uses_inputs |= l == inputs.node();
  if (!uses_inputs) fail(op, "the loss does not depend on inputs ", inputs.label());
  if (backends.size() > 1) g_eval = graph;  // forward only (copied before backward)
  if (cfg.forward_only) {
    n_fwd = n_bwd = graph.size();
    for (TensorNode* l : graph.leafs())
      if (l->flags & kFlagParam) params.emplace_back(l);
    if (!cfg.params.empty()) params = cfg.params;
    else if (cfg.model) params = cfg.model->parameters();
    state_a.resize(params.size());
    state_b.resize(params.size());
    return;
  }
  if (cfg.checkpointing) auto_checkpoint(graph);
  graph.backward(loss);
  n_fwd = graph.n_forward();
  n_bwd = graph.size();

  collect_params();
  if (backends.size() > 1) g_accum = graph;
  build_steps(ctx);

  // The order the backward pass finishes gradients: where each accumulation runs.
  std::unordered_map<const TensorNode*, size_t> index_of;
  for (size_t i = 0; i < grads.size(); ++i) index_of[grads[i].node()] = i;
  for (size_t k = n_fwd; k < n_bwd; ++k) {
    const TensorNode* n = graph.nodes()[k];
    if (n->op != Op::ACCUMULATE) continue;
    auto it = index_of.find(n->view_src);
    if (it == index_of.end()) continue;
    ready.push_back(it->second);
    ready_pos.push_back(k);
  }
  KILN_ASSERT(ready.size() == grads.size());
}

// Params: given (alone or in groups), the model's, or every param with a gradient.
void OptContext::Impl::collect_params() {
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
    given = cfg.model->parameters();
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
  if (cfg.model) dropout_seeds = cfg.model->dropout_seeds();
}

// One hp tensor per group (laid out as AdamWHyper / SgdHyper); with clipping,
// hp_eff = hp * mask, where the mask is 1 but at grad_scale, which it holds
// min(1, max/(norm + 1e-6)): the steps' gradient scale includes the factor.
void OptContext::Impl::build_steps(Context& ctx) {
  if (cfg.clip_grad_norm < 0 || !std::isfinite(cfg.clip_grad_norm))
    fail("opt", "clip_grad_norm must be >= 0 and finite, got ", cfg.clip_grad_norm);
  const bool adamw = cfg.optimizer == OptimizerType::adamw;
  const int64_t n_hp = adamw ? hyper_floats<AdamWHyper> : hyper_floats<SgdHyper>;
  const int64_t i_gs =
      adamw ? hyper_grad_scale_index<AdamWHyper>() : hyper_grad_scale_index<SgdHyper>();
  for (size_t g = 0; g < group_decay.size(); ++g) {
    hp.push_back(ctx.tensor(f32, {n_hp},
                            group_decay.size() == 1 ? "opt.hp" : "opt.hp." + std::to_string(g)));
    hp_eff.push_back(hp.back());
  }
  for (const Tensor& p : params) grads.push_back(graph.grad(p));
  if (cfg.clip_grad_norm > 0) {
    // The gradient the step applies is grad_scale * accumulator.
    Tensor sq;
    for (const Tensor& gr : grads) {
      Tensor s = sum(sqr(gr)).reshape({1});
      sq = sq.defined() ? sq + s : s;
    }
    grad_norm = (sqrt(sq) * hp[0].narrow(0, i_gs, 1)).set_name("opt.grad_norm");
    detail::set_flags(grad_norm, kFlagOutput);
    Tensor factor = clamp(full(ctx, {1}, cfg.clip_grad_norm) / (grad_norm + 1e-6f), 0.0f, 1.0f);
    std::vector<Tensor> parts;
    if (i_gs > 0) parts.push_back(ones(ctx, {i_gs}));
    parts.push_back(factor);
    if (i_gs + 1 < n_hp) parts.push_back(ones(ctx, {n_hp - i_gs - 1}));
    Tensor mask = parts.size() == 1 ? factor : concat(parts, 0);
    for (size_t g = 0; g < hp.size(); ++g) hp_eff[g] = hp[g] * mask;
  }
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    const std::string base = p.name().empty() ? "param" + std::to_string(i) : p.name();
    Tensor h = hp_eff[group_of[i]];
    Tensor a, b, s;
    if (cfg.optimizer == OptimizerType::adamw) {
      a = ctx.tensor(f32, p.shape(), base + ".opt.m");
      b = ctx.tensor(f32, p.shape(), base + ".opt.v");
      s = adamw_step(p, grads[i], a, b, h);
    } else {
      // A momentum buffer only when the schedule's first step uses momentum.
      if (schedule(StepInfo{}).sgd.momentum != 0.0f)
        a = ctx.tensor(f32, p.shape(), base + ".opt.buf");
      s = sgd_step(p, grads[i], a, h);
    }
    state_a.push_back(a);
    state_b.push_back(b);
    steps.push_back(s);
    graph.expand(s);
    if (backends.size() > 1) g_opt.expand(s);
  }
  if (grad_norm.defined()) {
    graph.expand(grad_norm);
    if (backends.size() > 1) g_opt.expand(grad_norm);
  }
}

void OptContext::Impl::allocate() {
  Backend& be0 = *backends[0];
  // Leaves live for the whole run: one static buffer of the preferred backend's
  // memory (tensors the user allocated already keep their memory).
  BufferType& bt = be0.buffer_type();
  // Gradients first, one after the other in the order backward finishes them,
  // so a data-parallel hook reduces runs of them in place (no packing).
  std::vector<TensorNode*> pending;
  std::unordered_set<const TensorNode*> queued;
  TensorAllocator measure(bt);
  auto queue = [&](TensorNode* l) {
    if (l->data || l->numel() == 0 || !queued.insert(l).second) return;
    pending.push_back(l);
    measure.alloc(l);
  };
  for (size_t i : ready) queue(grads[i].node());
  for (TensorNode* l : graph.leafs()) queue(l);
  static_bytes = measure.high_water();
  static_buf = bt.alloc(std::max<size_t>(static_bytes, bt.alignment()));
  static_buf->clear(0);  // gradients and moments start at zero
  TensorAllocator place(*static_buf);
  for (TensorNode* l : pending) place.place(l);

  if (backends.size() == 1) {
    for (TensorNode* n : graph.nodes())
      if (!be0.supports_op(n))
        fail("opt", "backend ", be0.name(), " does not support ", op_name(n->op), " (node ",
             n->label(), "): give several backends to run through the scheduler");
    galloc = std::make_unique<GraphAllocator>(bt);
    galloc->alloc(graph);
    plan = galloc->plan();
  } else {
    sched = std::make_unique<Scheduler>(backends);
    if (cfg.forward_only) {
      sched->alloc(g_eval);
      return;
    }
    sched->reserve(g_accum);
    sched->alloc(g_accum);
    sched_opt = std::make_unique<Scheduler>(backends);
    sched_opt->alloc(g_opt);
  }
}

// ---------------------------------------------------------------------------
// Running.

void OptContext::Impl::sync_params() {
  if (!par || synced) return;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < params.size(); ++i)
    for (const Tensor& t : {params[i], state_a[i], state_b[i]})
      if (t.defined()) ts.push_back(t);
  par->broadcast(ts);
  synced = true;
}

void OptContext::Impl::attach_parallel() {
  par = cfg.parallel;
  if (!par) return;
  std::vector<Tensor> in_order;
  for (size_t i : ready) in_order.push_back(grads[i]);
  cuts = par->attach(in_order);
  for (size_t j = 0; j < cuts.size(); ++j)
    if (cuts[j] == 0 || cuts[j] > ready.size() || (j > 0 && cuts[j] <= cuts[j - 1]))
      fail("opt", "the parallel hook's cut points are not ascending counts in [1, ", ready.size(),
           "]");
  if (!ready.empty() && (cuts.empty() || cuts.back() != ready.size()))
    fail("opt", "the parallel hook's last cut point must be the number of gradients, ",
         ready.size());
}

void OptContext::Impl::run_forward() {
  sync_params();
  if (galloc) {
    backends[0]->compute(std::span<TensorNode* const>(graph.nodes().data(), n_fwd));
  } else {
    sched->compute(g_eval);
  }
}

void OptContext::Impl::run_backward(bool before_step) {
  sync_params();
  // A new dropout mask per training pass (the same on every rank: the seed is
  // the pass count, which all ranks share).
  const int32_t seed = int32_t(uint32_t(uint64_t(passes++) & 0xffffffffu));
  for (Tensor& t : dropout_seeds)
    if (t.has_data()) t.set<int32_t>({seed});
  if (galloc && par && before_step && cuts.size() > 1) {
    // Pause after each group of finished gradients so the hook reduces them
    // while the rest of the backward pass runs.
    size_t begin = 0;
    for (size_t c : cuts) {
      const size_t end = c == ready.size() ? n_bwd : ready_pos[c - 1] + 1;
      backends[0]->compute(std::span<TensorNode* const>(graph.nodes().data() + begin, end - begin));
      par->grads_ready(c);
      begin = end;
    }
    notified = ready.size();
  } else if (galloc) {
    backends[0]->compute(std::span<TensorNode* const>(graph.nodes().data(), n_bwd));
  } else {
    sched->compute(g_accum);
  }
}

void OptContext::Impl::run_step() {
  const StepInfo info{step, epoch, steps_per_epoch, epochs};
  last = schedule(info);
  if (cfg.optimizer == OptimizerType::sgd && last.sgd.momentum != 0.0f && !state_a[0].defined())
    fail("opt", "SGD momentum is ", last.sgd.momentum, " at step ", step,
         " but was 0 at step 0, so the context keeps no momentum buffer");
  int ranks = 1;
  if (par) {
    if (notified < ready.size()) par->grads_ready(ready.size());
    par->finish_grads();
    notified = 0;
    ranks = par->size();
  }
  const float gscale = pending > 0 ? 1.0f / (float(pending) * float(ranks)) : 1.0f;
  for (size_t g = 0; g < hp.size(); ++g) {
    OptimizerParams q = last;
    if (group_decay[g]) q.adamw.weight_decay = q.sgd.weight_decay = *group_decay[g];
    if (cfg.optimizer == OptimizerType::adamw) {
      const auto h = hyper_values(adamw_hyper(q.adamw, step + 1, gscale));
      hp[g].set(std::span<const float>(h));
    } else {
      const auto h = hyper_values(sgd_hyper(q.sgd, step == 0, gscale));
      hp[g].set(std::span<const float>(h));
    }
  }
  if (galloc) {
    backends[0]->compute(
        std::span<TensorNode* const>(graph.nodes().data() + n_bwd, graph.size() - n_bwd));
  } else {
    sched_opt->compute(g_opt);
  }
  ++step;
  pending = 0;
  zero_grads();
}

double OptContext::Impl::read_scalar(Tensor t) const {
  TensorNode* n = t.node();
  if (n->buffer && n->is_contiguous()) {
    if (n->dtype == f32) {
      float x;
      n->buffer->get(n, &x, 0, 4);
      return x;
    }
    if (n->dtype == i32) {
      int32_t x;
      n->buffer->get(n, &x, 0, 4);
      return x;
    }
  }
  return t.item();
}

void OptContext::Impl::zero_grads() {
  for (Tensor& g : grads) g.fill_zero();
}

// ---------------------------------------------------------------------------
// Public surface.

OptContext::OptContext(OptConfig cfg) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = std::move(cfg);
  if (s.cfg.backends.empty()) {
    s.own_backend = std::make_unique<CpuBackend>(s.cfg.n_threads);
    s.backends = {s.own_backend.get()};
  } else {
    for (Backend* b : s.cfg.backends)
      if (!b) fail("opt", "a backend is null");
    s.backends = s.cfg.backends;
  }
  s.schedule = s.cfg.schedule ? s.cfg.schedule : schedule::constant();
  s.build();
  s.logical = s.cfg.logical_batch > 0 ? s.cfg.logical_batch : s.B;
  if (s.logical % s.B != 0)
    fail("opt", "the logical batch ", s.logical, " is not a multiple of the physical batch ", s.B,
         " (inputs ", s.inputs.shape().str(), ")");
  s.k = s.logical / s.B;
  s.allocate();
  s.attach_parallel();
}

OptContext::~OptContext() = default;

Tensor OptContext::inputs() const { return impl_->inputs; }
Tensor OptContext::labels() const { return impl_->labels; }
Tensor OptContext::outputs() const { return impl_->outputs; }
Tensor OptContext::loss() const { return impl_->loss; }
Tensor OptContext::pred() const { return impl_->pred; }
Tensor OptContext::n_correct() const { return impl_->correct; }
const std::vector<Tensor>& OptContext::params() const { return impl_->params; }
Tensor OptContext::grad(Tensor param) const { return impl_->graph.grad(param); }
double OptContext::grad_norm() const {
  const Impl& s = *impl_;
  if (!s.grad_norm.defined() || s.step == 0) return std::nan("");
  return s.read_scalar(s.grad_norm);
}
std::pair<Tensor, Tensor> OptContext::state(Tensor param) const {
  for (size_t i = 0; i < impl_->params.size(); ++i)
    if (impl_->params[i] == param) return {impl_->state_a[i], impl_->state_b[i]};
  return {};
}
OptimizerType OptContext::optimizer() const { return impl_->cfg.optimizer; }
LossKind OptContext::loss_kind() const { return impl_->cfg.loss; }
int64_t OptContext::physical_batch() const { return impl_->B; }
int64_t OptContext::logical_batch() const { return impl_->logical; }
int64_t OptContext::accumulation_steps() const { return impl_->k; }
int64_t OptContext::step() const { return impl_->step; }
int64_t OptContext::epoch() const { return impl_->epoch; }
void OptContext::set_epoch(int64_t e) { impl_->epoch = e; }
void OptContext::set_run_length(int64_t steps_per_epoch, int64_t epochs) {
  impl_->steps_per_epoch = steps_per_epoch;
  impl_->epochs = epochs;
}
void OptContext::set_schedule(ScheduleFn fn) {
  impl_->schedule = fn ? std::move(fn) : schedule::constant();
}
const OptimizerParams& OptContext::last_params() const { return impl_->last; }
int64_t OptContext::pending_batches() const { return impl_->pending; }
ParallelHook* OptContext::parallel() const { return impl_->par; }
int OptContext::rank() const { return impl_->par ? impl_->par->rank() : 0; }
int OptContext::world_size() const { return impl_->par ? impl_->par->size() : 1; }
Backend& OptContext::backend() { return *impl_->backends[0]; }
Backend* OptContext::backend_of(const TensorNode* t) const {
  const Impl& s = *impl_;
  if (!s.sched) {
    for (const TensorNode* n : s.graph.nodes())
      if (n == t) return s.backends[0];
    return nullptr;
  }
  if (Backend* b = s.sched->backend_of(t)) return b;
  return s.sched_opt ? s.sched_opt->backend_of(t) : nullptr;
}
const MemoryPlan& OptContext::memory_plan() const { return impl_->plan; }
size_t OptContext::static_bytes() const { return impl_->static_bytes; }
const Graph& OptContext::graph() const { return impl_->graph; }
size_t OptContext::n_forward_nodes() const { return impl_->n_fwd; }
size_t OptContext::n_backward_nodes() const { return impl_->n_bwd; }

void OptContext::forward() { impl_->run_forward(); }

void OptContext::Impl::check_trainable() const {
  if (cfg.forward_only)
    fail("opt", "this context is forward-only (OptConfig::forward_only): it cannot train");
}

void OptContext::forward_backward() {
  impl_->check_trainable();
  impl_->run_backward();
  ++impl_->pending;
}

void OptContext::optimizer_step() {
  impl_->check_trainable();
  impl_->run_step();
}

void OptContext::reset_grads() {
  if (impl_->par && impl_->notified > 0) {
    impl_->par->finish_grads();  // reductions in flight must land before zeroing
    impl_->notified = 0;
  }
  impl_->zero_grads();
  impl_->pending = 0;
}

double OptContext::train_batch(Result* r) {
  Impl& s = *impl_;
  s.check_trainable();
  s.run_backward(s.pending + 1 == s.k);
  const double l = s.read_scalar(s.loss);
  if (!std::isfinite(l))
    fail("fit", "loss is ", std::isnan(l) ? "NaN" : "Inf", " at step ", s.step, " (epoch ", s.epoch,
         ", physical batch ", s.pending + 1, " of ", s.k, ")");
  ++s.pending;
  if (r) r->add(l, s.B, s.correct.defined() ? int64_t(s.read_scalar(s.correct)) : -1);
  if (s.pending == s.k) s.run_step();
  return l;
}

double OptContext::eval_batch(Result* r, int64_t samples) {
  Impl& s = *impl_;
  if (samples == 0) samples = s.B;
  if (samples < 1 || samples > s.B)
    fail("evaluate", "samples must be in [1, ", s.B, "] (the physical batch), got ", samples);
  s.run_forward();
  double l = 0;
  int64_t correct = -1;
  if (samples == s.B) {
    l = s.read_scalar(s.loss);
    if (s.correct.defined()) correct = int64_t(s.read_scalar(s.correct));
  } else {
    l = s.partial_loss(samples, &correct);
  }
  if (!std::isfinite(l))
    fail("evaluate", "loss is ", std::isnan(l) ? "NaN" : "Inf", " on an evaluation batch of ",
         samples, " samples (after ", s.step, " optimizer steps, epoch ", s.epoch, ")");
  if (r) r->add(l, samples, correct);
  return l;
}

// Loss (and correct predictions) of the first P rows, from the outputs on the
// host, with the graph's formulas: cross-entropy as log-sum-exp minus the label's
// logit (or minus sum(p * log_softmax)), mse as the mean squared difference.
double OptContext::Impl::partial_loss(int64_t P, int64_t* n_correct) const {
  if (cfg.loss == LossKind::user)
    fail("evaluate", "a user loss cannot be evaluated on a partial batch of ", P, " of ", B,
         " samples: it is not a mean over samples that kiln can split");
  const std::vector<float> out = outputs.get<float>();
  const int64_t per = outputs.numel() / B;
  double total = 0;
  if (cfg.loss == LossKind::mse) {
    const std::vector<float> want = labels.get<float>();
    for (int64_t k = 0; k < P * per; ++k)
      total +=
          (double(out[size_t(k)]) - want[size_t(k)]) * (double(out[size_t(k)]) - want[size_t(k)]);
    return total / double(P * per);
  }
  const int64_t C = per;
  std::vector<int32_t> lab;
  std::vector<float> prob;
  if (labels.dtype() == i32) lab = labels.get<int32_t>();
  else prob = labels.get<float>();
  std::vector<int32_t> pred_v;
  if (pred.defined()) pred_v = pred.get<int32_t>();
  int64_t hits = 0;
  for (int64_t i = 0; i < P; ++i) {
    const float* row = out.data() + i * C;
    double m = -INFINITY, z = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, double(row[c]));
    for (int64_t c = 0; c < C; ++c) z += std::exp(double(row[c]) - m);
    const double lse = m + std::log(z);
    int64_t target = 0;
    if (!lab.empty()) {
      target = lab[size_t(i)];
      if (target < 0 || target >= C)
        fail("cross_entropy", "label ", target, " at position ", i, " is out of range [0, ", C,
             ")");
      total += lse - row[target];
    } else {
      const float* p = prob.data() + i * C;
      for (int64_t c = 0; c < C; ++c) {
        total -= double(p[c]) * (double(row[c]) - lse);
        if (p[c] > p[target]) target = c;
      }
    }
    if (!pred_v.empty()) hits += pred_v[size_t(i)] == target;
  }
  if (correct.defined()) *n_correct = hits;
  return total / double(P);
}

}  // namespace kiln
