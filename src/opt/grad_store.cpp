// GradStore: host-side gradients keyed by param; Optimizer: kiln's step ops
// driven from a store (see kiln/grad_store.h).
#include "kiln/grad_store.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "kiln/context.h"
#include "kiln/ext/alloc.h"

namespace kiln {

namespace {

std::string label(Tensor t) {
  return t.name().empty() ? "#" + std::to_string(t.node()->id) : "'" + t.name() + "'";
}

void check_param(const char* op, Tensor param) {
  if (!param.defined()) fail(op, "param is an undefined tensor");
  if (!param.has_flag(kFlagParam))
    fail(op, "", label(param), " is not a param: create it with Context::param");
}

}  // namespace

// ---------------------------------------------------------------------------
// GradStore

GradStore::GradStore(const Graph& g) {
  for (TensorNode* l : g.leafs()) {
    if (!(l->flags & kFlagParam) || (l->flags & kFlagGradAcc)) continue;
    Tensor acc = g.grad(Tensor(l));
    if (acc.defined()) add(Tensor(l), acc);
  }
}

GradStore::Entry& GradStore::entry(Tensor param) {
  check_param("grad_store", param);
  auto [it, fresh] = index_of_.emplace(param.node(), entries_.size());
  if (fresh) entries_.push_back({param, std::vector<float>(size_t(param.numel()), 0.0f)});
  return entries_[it->second];
}

const GradStore::Entry* GradStore::find(Tensor param) const {
  if (!param.defined()) return nullptr;
  auto it = index_of_.find(param.node());
  return it == index_of_.end() ? nullptr : &entries_[it->second];
}

void GradStore::add(Tensor param, std::span<const float> grad) {
  check_param("grad_store", param);
  if (grad.size() != size_t(param.numel()))
    fail("grad_store", "gradient of param ", label(param), " ", param.shape().str(), " has ",
         grad.size(), " values, the param ", param.numel());
  Entry& e = entry(param);
  for (size_t i = 0; i < grad.size(); ++i) e.grad[i] += grad[i];
}

void GradStore::add(Tensor param, Tensor grad) {
  check_param("grad_store", param);
  if (!grad.defined()) fail("grad_store", "gradient of param ", label(param), " is undefined");
  if (grad.dtype() != f32 || !(grad.shape() == param.shape()))
    fail("grad_store", "gradient ", label(grad), " ", dtype_name(grad.dtype()), " ",
         grad.shape().str(), " does not match param ", label(param), " f32 ", param.shape().str());
  const std::vector<float> v = grad.get<float>();
  add(param, std::span<const float>(v));
}

void GradStore::merge(const GradStore& other) {
  if (&other == this) {
    scale(2.0f);
    return;
  }
  for (const Entry& e : other.entries_) add(e.param, std::span<const float>(e.grad));
}

bool GradStore::contains(Tensor param) const { return find(param) != nullptr; }

std::span<const float> GradStore::get(Tensor param) const {
  const Entry* e = find(param);
  if (!e)
    fail("grad_store", "no gradient for ",
         param.defined() ? "param " + label(param) : std::string("an undefined tensor"));
  return e->grad;
}

std::span<float> GradStore::get(Tensor param) {
  std::span<const float> g = std::as_const(*this).get(param);
  return {const_cast<float*>(g.data()), g.size()};
}

std::vector<float> GradStore::remove(Tensor param) {
  if (!find(param)) return {};
  const size_t i = index_of_.at(param.node());
  std::vector<float> g = std::move(entries_[i].grad);
  entries_.erase(entries_.begin() + std::ptrdiff_t(i));
  index_of_.erase(param.node());
  for (auto& [node, k] : index_of_)
    if (k > i) --k;
  return g;
}

std::vector<Tensor> GradStore::params() const {
  std::vector<Tensor> out;
  for (const Entry& e : entries_) out.push_back(e.param);
  return out;
}

void GradStore::scale(float factor) {
  for (Entry& e : entries_)
    for (float& x : e.grad) x *= factor;
}

void GradStore::clear() {
  entries_.clear();
  index_of_.clear();
}

double GradStore::norm() const {
  double sq = 0;
  for (const Entry& e : entries_)
    for (float x : e.grad) sq += double(x) * double(x);
  return std::sqrt(sq);
}

double GradStore::clip(float max_norm) {
  if (!(max_norm >= 0) || !std::isfinite(max_norm))
    fail("grad_store", "clip: max_norm must be >= 0 and finite, got ", max_norm);
  const double n = norm();
  if (n > max_norm) scale(float(double(max_norm) / (n + 1e-6)));
  return n;
}

// ---------------------------------------------------------------------------
// Optimizer

Optimizer::Optimizer(std::vector<Tensor> params, Backend& backend, OptimizerOptions opt)
    : backend_(backend), opt_(std::move(opt)) {
  const char* op = "optimizer";
  // Frozen params get no state (PyTorch's optimizers skip params without grads).
  for (const Tensor& p : params)
    if (!p.defined() || !p.has_flag(kFlagParam) || p.requires_grad()) params_.push_back(p);
  if (params_.empty())
    fail(op, params.empty() ? "no params to optimize" : "every param given is frozen");
  if (!opt_.schedule) opt_.schedule = schedule::constant();
  const bool momentum =
      opt_.type == OptimizerType::sgd && opt_.schedule(StepInfo{}).sgd.momentum != 0.0f;
  std::vector<TensorNode*> leaves;
  for (size_t i = 0; i < params_.size(); ++i) {
    Tensor p = params_[i];
    check_param(op, p);
    if (p.dtype() != f32) fail(op, "param ", label(p), " is ", dtype_name(p.dtype()), ", not f32");
    if (!p.has_data()) fail(op, "param ", label(p), " has no memory: allocate the model first");
    if (!index_of_.emplace(p.node(), i).second) fail(op, "param ", label(p), " is listed twice");
    Context& ctx = p.ctx();
    const std::string base = p.name().empty() ? "param" + std::to_string(i) : p.name();
    Tensor g = ctx.tensor(f32, p.shape(), base + ".grad_in");
    Tensor hp = ctx.tensor(
        f32,
        {opt_.type == OptimizerType::adamw ? hyper_floats<AdamWHyper> : hyper_floats<SgdHyper>},
        base + ".opt.hp");
    OptimizerState st;
    Tensor s;
    if (opt_.type == OptimizerType::adamw) {
      st.m = ctx.tensor(f32, p.shape(), base + ".opt.m");
      st.v = ctx.tensor(f32, p.shape(), base + ".opt.v");
      s = adamw_step(p, g, st.m, st.v, hp);
    } else {
      if (momentum) st.buf = ctx.tensor(f32, p.shape(), base + ".opt.buf");
      s = sgd_step(p, g, st.buf, hp);
    }
    for (const Tensor& t : {g, hp, st.m, st.v, st.buf})
      if (t.defined() && t.numel() > 0) leaves.push_back(t.node());
    grads_.push_back(g);
    hp_.push_back(hp);
    state_.push_back(st);
    steps_nodes_.push_back(s);
  }
  param_steps_.assign(params_.size(), 0);
  BufferType& bt = backend_.buffer_type();
  TensorAllocator measure(bt);
  for (TensorNode* l : leaves) measure.alloc(l);
  buffer_ = bt.alloc(std::max<size_t>(measure.high_water(), bt.alignment()));
  buffer_->clear(0);  // moments start at zero
  TensorAllocator place(*buffer_);
  for (TensorNode* l : leaves) place.place(l);
  for (const Tensor& s : steps_nodes_) {
    TensorNode* n = s.node();
    n->data = n->view_src->data;
    n->buffer = n->view_src->buffer;
  }
}

Optimizer::~Optimizer() = default;

size_t Optimizer::index(Tensor param) const {
  auto it = param.defined() ? index_of_.find(param.node()) : index_of_.end();
  if (it == index_of_.end())
    fail("optimizer", "param ", param.defined() ? label(param) : std::string("(undefined)"),
         " is not one of this optimizer's ", params_.size(), " params");
  return it->second;
}

OptimizerState Optimizer::state(Tensor param) const { return state_[index(param)]; }

void Optimizer::step(const GradStore& grads) {
  std::vector<size_t> which;
  for (const Tensor& p : grads.params()) which.push_back(index(p));
  const OptimizerParams q = opt_.schedule(StepInfo{steps_, 0, 0, 0});
  if (opt_.type == OptimizerType::sgd && q.sgd.momentum != 0.0f && !state_[0].buf.defined())
    fail("optimizer", "SGD momentum is ", q.sgd.momentum, " at step ", steps_,
         " but was 0 at step 0, so the optimizer keeps no momentum buffer");
  std::vector<TensorNode*> nodes;
  for (size_t i : which) {
    grads_[i].set(grads.get(params_[i]));
    const int64_t t = ++param_steps_[i];
    if (opt_.type == OptimizerType::adamw) {
      const auto h = hyper_values(adamw_hyper(q.adamw, t));
      hp_[i].set(std::span<const float>(h));
    } else {
      const auto h = hyper_values(sgd_hyper(q.sgd, t == 1));
      hp_[i].set(std::span<const float>(h));
    }
    nodes.push_back(steps_nodes_[i].node());
  }
  if (!nodes.empty()) backend_.compute(std::span<TensorNode* const>(nodes));
  backend_.synchronize();
  ++steps_;
}

}  // namespace kiln
