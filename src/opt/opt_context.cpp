// OptContext: the composition of its loss and metrics, its step program and its
// runner (opt_context_impl.h), built and allocated once (docs/design.md,
// principle 7). Per step: the caller uploads a batch, the context writes the
// step's hyper-parameters and computes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "opt/opt_context_impl.h"

namespace kiln {

// ---------------------------------------------------------------------------
// Running.

void OptContext::Impl::attach_parallel() {
  par = cfg.parallel;
  if (!par) return;
  const std::vector<size_t>& ready = prog.ready;
  std::vector<Tensor> in_order;
  for (size_t i : ready) in_order.push_back(prog.grads[i]);
  cuts = par->attach(in_order);
  for (size_t j = 0; j < cuts.size(); ++j)
    if (cuts[j] == 0 || cuts[j] > ready.size() || (j > 0 && cuts[j] <= cuts[j - 1]))
      fail("opt", "the parallel hook's cut points are not ascending counts in [1, ", ready.size(),
           "]");
  if (!ready.empty() && (cuts.empty() || cuts.back() != ready.size()))
    fail("opt", "the parallel hook's last cut point must be the number of gradients, ",
         ready.size());
}

void OptContext::Impl::sync_params() {
  if (!par || synced) return;
  std::vector<Tensor> ts;
  for (size_t i = 0; i < prog.params.size(); ++i)
    for (const Tensor& t : {prog.params[i], prog.state[i].m, prog.state[i].v, prog.state[i].buf})
      if (t.defined()) ts.push_back(t);
  par->broadcast(ts);
  synced = true;
}

void OptContext::Impl::run_forward(bool with_tail) {
  sync_params();
  if (with_tail) runner->forward_with_tail();
  else runner->forward();
}

void OptContext::Impl::run_backward(bool before_step) {
  sync_params();
  // A new dropout mask per training pass (the same on every rank: the seed is
  // the pass count, which all ranks share).
  const int32_t seed = int32_t(uint32_t(uint64_t(passes++) & 0xffffffffu));
  for (Tensor& t : dropout_seeds)
    if (t.has_data()) t.set<int32_t>({seed});
  if (par && before_step && cuts.size() > 1 && !runner->several()) {
    runner->backward(cuts, [this](size_t c) { par->grads_ready(c); });
    notified = prog.ready.size();
  } else {
    runner->backward();
  }
}

void OptContext::Impl::run_step() {
  const StepInfo info{step, epoch, steps_per_epoch, epochs};
  last = schedule(info);
  if (cfg.optimizer == OptimizerType::sgd && last.sgd.momentum != 0.0f &&
      !prog.state[0].buf.defined())
    fail("opt", "SGD momentum is ", last.sgd.momentum, " at step ", step,
         " but was 0 at step 0, so the context keeps no momentum buffer");
  int ranks = 1;
  if (par) {
    if (notified < prog.ready.size()) par->grads_ready(prog.ready.size());
    par->finish_grads();
    notified = 0;
    ranks = par->size();
  }
  const float grad_scale = pending > 0 ? 1.0f / (float(pending) * float(ranks)) : 1.0f;
  prog.write_hyper(last, step, grad_scale);
  runner->steps();
  ++step;
  pending = 0;
  zero_grads();
}

void OptContext::Impl::zero_grads() { prog.zero_grads(); }

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

void OptContext::Impl::check_trainable() const {
  if (cfg.forward_only)
    fail("opt", "this context is forward-only (OptConfig::forward_only): it cannot train");
}

// ---------------------------------------------------------------------------
// Public surface.

OptContext::OptContext(OptConfig cfg) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.cfg = std::move(cfg);
  s.runner = std::make_unique<GraphRunner>(s.cfg.backends, s.cfg.n_threads);
  s.schedule = s.cfg.schedule ? s.cfg.schedule : schedule::constant();
  s.lm.build(s.cfg);
  s.B = s.lm.batch();
  const GraphKind kind = s.cfg.forward_only ? GraphKind::inference : GraphKind::training;
  const GraphPasses passes = s.cfg.passes.value_or(GraphPasses::defaults(kind));
  check_graph_passes("opt", passes, kind);
  s.prog.build(s.cfg, s.lm, s.schedule, s.runner->several(), s.runner->passes(passes),
               s.runner->backend().buffer_type());
  if (s.cfg.model && !s.cfg.forward_only) s.dropout_seeds = s.cfg.model->dropout_seeds();
  s.logical = s.cfg.logical_batch > 0 ? s.cfg.logical_batch : s.B;
  if (s.logical % s.B != 0)
    fail("opt", "the logical batch ", s.logical, " is not a multiple of the physical batch ", s.B,
         " (inputs ", s.lm.inputs.shape().str(), ")");
  s.k = s.logical / s.B;
  s.runner->allocate(s.prog, s.cfg.forward_only);
  s.prog.write_constants();
  s.attach_parallel();
}

OptContext::~OptContext() = default;

Tensor OptContext::inputs() const { return impl_->lm.inputs; }
Tensor OptContext::labels() const { return impl_->lm.labels; }
Tensor OptContext::outputs() const { return impl_->lm.outputs; }
Tensor OptContext::loss() const { return impl_->lm.loss; }
Tensor OptContext::n_correct() const { return impl_->lm.correct; }
const std::vector<Tensor>& OptContext::params() const { return impl_->prog.params; }
Tensor OptContext::grad(Tensor param) const { return impl_->prog.graph.grad(param); }
GraphPasses OptContext::graph_passes() const { return impl_->prog.passes_run; }
double OptContext::grad_norm() const {
  const Impl& s = *impl_;
  if (!s.prog.grad_norm.defined() || s.step == 0) return std::nan("");
  return s.read_scalar(s.prog.grad_norm);
}
OptimizerState OptContext::state(Tensor param) const {
  const StepProgram& p = impl_->prog;
  for (size_t i = 0; i < p.params.size(); ++i)
    if (p.params[i] == param) return p.state[i];
  return {};
}
int64_t OptContext::physical_batch() const { return impl_->B; }
int64_t OptContext::logical_batch() const { return impl_->logical; }
int64_t OptContext::accumulation_steps() const { return impl_->k; }
int64_t OptContext::step() const { return impl_->step; }
int64_t OptContext::epoch() const { return impl_->epoch; }
void OptContext::set_schedule(ScheduleFn fn) {
  impl_->schedule = fn ? std::move(fn) : schedule::constant();
}
const OptimizerParams& OptContext::last_params() const { return impl_->last; }
int64_t OptContext::pending_batches() const { return impl_->pending; }
Backend& OptContext::backend() { return impl_->runner->backend(); }
Backend* OptContext::backend_of(const TensorNode* t) const { return impl_->runner->backend_of(t); }
const MemoryPlan& OptContext::memory_plan() const { return impl_->runner->plan(); }
size_t OptContext::static_bytes() const { return impl_->runner->static_bytes(); }
const Graph& OptContext::graph() const { return impl_->prog.graph; }
size_t OptContext::n_forward_nodes() const { return impl_->prog.n_fwd; }
size_t OptContext::n_backward_nodes() const { return impl_->prog.n_bwd; }

void OptContext::forward() { impl_->run_forward(); }

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
  const double l = s.read_scalar(s.lm.loss);
  if (!std::isfinite(l))
    fail("fit", "loss is ", std::isnan(l) ? "NaN" : "Inf", " at step ", s.step, " (epoch ", s.epoch,
         ", physical batch ", s.pending + 1, " of ", s.k, ")");
  ++s.pending;
  if (r) r->add(l, s.B, s.lm.correct.defined() ? int64_t(s.read_scalar(s.lm.correct)) : -1);
  if (s.pending == s.k) s.run_step();
  return l;
}

double OptContext::eval_batch(Result* r, int64_t samples) {
  Impl& s = *impl_;
  const LossMetrics& lm = s.lm;
  if (samples == 0) samples = s.B;
  if (samples < 1 || samples > s.B)
    fail("evaluate", "samples must be in [1, ", s.B, "] (the physical batch), got ", samples);
  double l = 0;
  int64_t correct = -1;
  if (samples == s.B) {
    s.run_forward();
    l = s.read_scalar(lm.loss);
    if (lm.correct.defined()) correct = int64_t(s.read_scalar(lm.correct));
  } else {
    if (!lm.splittable())
      fail("evaluate", "a user loss cannot be evaluated on a partial batch of ", samples, " of ",
           s.B, " samples: it is not a mean over samples that kiln can split");
    std::vector<float> mask(size_t(s.B), 0.0f);
    std::fill(mask.begin(), mask.begin() + samples, 1.0f);
    Tensor(lm.sample_mask).set(mask);
    s.run_forward(/*with_tail=*/true);
    l = s.read_scalar(lm.partial_loss);
    if (lm.partial_correct.defined()) correct = std::llround(s.read_scalar(lm.partial_correct));
  }
  if (!std::isfinite(l))
    fail("evaluate", "loss is ", std::isnan(l) ? "NaN" : "Inf", " on an evaluation batch of ",
         samples, " samples (after ", s.step, " optimizer steps, epoch ", s.epoch, ")");
  if (r) r->add(l, samples, correct);
  return l;
}

}  // namespace kiln
