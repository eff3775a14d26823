// Module: the tree of named params and sub-modules, memory, init, modes.
#include <algorithm>
#include <unordered_set>

#include "kiln/ext/alloc.h"
#include "kiln/ext/rng.h"
#include "kiln/graph.h"
#include "kiln/nn.h"

namespace kiln::nn {

namespace {

// FNV-1a: a stable hash of a path (seeds must not depend on std::hash).
uint64_t hash_name(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

std::string_view first_part(std::string_view name, std::string_view* rest) {
  const size_t dot = name.find('.');
  *rest = dot == std::string_view::npos ? std::string_view() : name.substr(dot + 1);
  return name.substr(0, dot);
}

}  // namespace

Module::Module(Context& ctx) : ctx_(&ctx) {}
Module::~Module() = default;
Module::Module(Module&&) noexcept = default;

Tensor Module::operator()(Tensor x) {
  Tensor y = forward(x);
  return checkpoint_ ? kiln::checkpoint(y) : y;
}

Tensor Module::forward(Tensor) {
  fail("nn", type_name(), " '", path(), "' has no one-tensor forward(); call its parts");
}

std::string Module::path() const {
  return prefix_.empty() ? std::string() : prefix_.substr(0, prefix_.size() - 1);
}

// Hashed lookups by name keep building, naming and loading a model of many
// layers linear in its size (a linear scan per name made them quadratic).
void Module::check_new_name(const std::string& name) const {
  if (name.empty() || name.find('.') != std::string::npos)
    fail("nn", type_name(), " '", path(), "': name '", name,
         "' must be non-empty and contain no '.'");
  if (param_pos_.count(name))
    fail("nn", type_name(), " '", path(), "' already has a param called '", name, "'");
  if (child_pos_.count(name))
    fail("nn", type_name(), " '", path(), "' already has a sub-module called '", name, "'");
}

Tensor Module::register_parameter(std::string name, const Shape& shape) {
  check_new_name(name);
  Tensor t = ctx_->param(f32, shape, prefix_ + name);
  param_pos_.emplace(name, params_.size());
  params_.emplace_back(std::move(name), t);
  return t;
}

void Module::adopt(std::string name, std::unique_ptr<Module> m) {
  check_new_name(name);
  if (!m) fail("nn", type_name(), " '", path(), "': sub-module '", name, "' is null");
  if (m->ctx_ != ctx_)
    fail("nn", "sub-module '", name, "' was built in another Context than its parent");
  m->set_prefix(prefix_ + name + ".");
  m->train(training_);
  child_pos_.emplace(name, children_.size());
  children_.emplace_back(std::move(name), std::move(m));
}

// Renames the tensors this module owns (a tied tensor keeps its owner's name).
void Module::set_prefix(const std::string& prefix) {
  for (auto& [n, t] : params_)
    if (t.name() == prefix_ + n) t.set_name(prefix + n);
  if (seed_.defined()) seed_.set_name(prefix + "dropout_seed");
  prefix_ = prefix;
  for (auto& [n, m] : children_) m->set_prefix(prefix + n + ".");
}

void Module::collect(std::vector<std::pair<std::string, Tensor>>& out,
                     std::unordered_set<const TensorNode*>& seen, bool adapters) const {
  if (adapter_ && !adapters) return;
  for (const auto& [n, t] : params_)
    if (seen.insert(t.node()).second) out.emplace_back(prefix_ + n, t);
  for (const auto& [n, m] : children_) m->collect(out, seen, adapters);
}

namespace {
std::vector<std::pair<std::string, Tensor>> relative(std::vector<std::pair<std::string, Tensor>> v,
                                                     size_t prefix) {
  // Names relative to this module, also when it sits inside a bigger tree.
  for (auto& [n, t] : v) n.erase(0, prefix);
  return v;
}
}  // namespace

std::vector<std::pair<std::string, Tensor>> Module::named_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorNode*> seen;
  collect(out, seen, true);
  return relative(std::move(out), prefix_.size());
}

std::vector<std::pair<std::string, Tensor>> Module::named_base_parameters() const {
  std::vector<std::pair<std::string, Tensor>> out;
  std::unordered_set<const TensorNode*> seen;
  collect(out, seen, false);
  return relative(std::move(out), prefix_.size());
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters()) out.push_back(t);
  return out;
}

std::vector<Tensor> Module::trainable_parameters() const {
  std::vector<Tensor> out;
  for (auto& [n, t] : named_parameters())
    if (t.requires_grad()) out.push_back(t);
  return out;
}

void Module::set_requires_grad(bool on) {
  for (auto& [n, t] : named_parameters()) t.set_requires_grad(on);
}

std::vector<std::pair<std::string, Module*>> Module::named_children() const {
  std::vector<std::pair<std::string, Module*>> out;
  for (const auto& [n, m] : children_) out.emplace_back(n, m.get());
  return out;
}

Module& Module::child(std::string_view name) const {
  std::string_view rest;
  const std::string_view head = first_part(name, &rest);
  const auto it = child_pos_.find(std::string(head));
  if (it != child_pos_.end()) {
    Module& m = *children_[it->second].second;
    return rest.empty() ? m : m.child(rest);
  }
  fail("nn", type_name(), " '", path(), "' has no sub-module '", head, "'");
}

Tensor Module::parameter(std::string_view name) const {
  const size_t dot = name.rfind('.');
  const Module& owner = dot == std::string_view::npos ? *this : child(name.substr(0, dot));
  const std::string_view local = dot == std::string_view::npos ? name : name.substr(dot + 1);
  const auto it = owner.param_pos_.find(std::string(local));
  if (it != owner.param_pos_.end()) return owner.params_[it->second].second;
  fail("nn", owner.type_name(), " '", owner.path(), "' has no param '", local, "'");
}

void Module::tie(std::string_view name, Tensor shared) {
  const auto pos = param_pos_.find(std::string(name));
  if (pos == param_pos_.end())
    fail("nn", type_name(), " '", path(), "' has no param '", name, "' to tie");
  auto it = params_.begin() + std::ptrdiff_t(pos->second);
  if (!shared.defined()) fail("nn", "tie '", prefix_, name, "': the shared tensor is undefined");
  if (!shared.has_flag(kFlagParam))
    fail("nn", "tie '", prefix_, name, "': '", shared.name(), "' is not a param (Context::param)");
  if (&shared.ctx() != ctx_)
    fail("nn", "tie '", prefix_, name, "': the shared tensor is from another Context");
  const Tensor old = it->second;
  if (shared.dtype() != old.dtype() || !(shared.shape() == old.shape()))
    fail("nn", "tie '", prefix_, name, "': '", shared.name(), "' is ", dtype_name(shared.dtype()),
         " ", shared.shape().str(), " but the param is ", dtype_name(old.dtype()), " ",
         old.shape().str());
  it->second = shared;
}

Tensor Module::set_parameter_dtype(std::string_view name, DType dtype) {
  return set_parameter_dtypes({{std::string(name), dtype}})[0];
}

std::vector<Tensor> Module::set_parameter_dtypes(
    const std::vector<std::pair<std::string, DType>>& changes) {
  std::vector<Tensor> out;
  std::unordered_map<const TensorNode*, Tensor> now;  // old param -> its replacement
  for (const auto& [name, dtype] : changes) {
    const Tensor old = parameter(name);
    if (const auto it = now.find(old.node()); it != now.end()) {  // named twice (tied)
      if (it->second.dtype() != dtype)
        fail("nn", "set_parameter_dtypes '", name, "': ", old.label(), " is asked for two dtypes");
      out.push_back(it->second);
      continue;
    }
    if (old.dtype() == dtype) {
      out.push_back(old);
      continue;
    }
    if (old.has_data())
      fail("nn", "set_parameter_dtype '", name, "': ", old.label(),
           " already has memory; change dtypes before allocate()");
    out.push_back(ctx_->param(dtype, old.shape(), old.name()));
    now.emplace(old.node(), out.back());
  }
  if (!now.empty()) replace_params(now);  // one walk of the tree for all of them
  return out;
}

Tensor Module::reallocate_parameter(std::string_view name, DType dtype) {
  const Tensor old = parameter(name);
  if (!old.has_data())
    fail("nn", "reallocate_parameter '", name, "': ", old.label(),
         " has no memory yet; use set_parameter_dtype");
  Tensor now = ctx_->param(dtype, old.shape(), old.name());
  if (!old.requires_grad()) now.set_requires_grad(false);
  BufferType& bt = old.node()->buffer->type();
  TensorAllocator measure(bt);
  measure.alloc(now.node());
  std::unique_ptr<Buffer> buf = bt.alloc(std::max(measure.high_water(), bt.alignment()));
  buf->clear(0);
  TensorAllocator place(*buf);
  place.place(now.node());
  storage_.push_back(std::move(buf));
  replace_params({{old.node(), now}});
  return now;
}

void Module::replace_params(const std::unordered_map<const TensorNode*, Tensor>& now) {
  for (auto& [n, t] : params_)
    if (const auto it = now.find(t.node()); it != now.end()) t = it->second;
  for (auto& [n, m] : children_) m->replace_params(now);
}

void Module::allocate(Backend& backend) {
  std::vector<TensorNode*> unplaced;
  for (auto& [n, t] : named_parameters())
    if (!t.has_data()) unplaced.push_back(t.node());
  if (unplaced.empty()) return;
  BufferType& bt = backend.buffer_type();
  TensorAllocator measure(bt);
  for (TensorNode* t : unplaced) measure.alloc(t);
  std::unique_ptr<Buffer> buf = bt.alloc(std::max(measure.high_water(), bt.alignment()));
  buf->clear(0);
  TensorAllocator place(*buf);
  for (TensorNode* t : unplaced) place.place(t);
  // A later call (params added since) adds a buffer; earlier ones stay.
  storage_.push_back(std::move(buf));
}

void Module::init_tree(uint64_t seed) {
  reset_parameters(detail::splitmix64(seed ^ hash_name(prefix_)));
  for (auto& [n, m] : children_) m->init_tree(seed);
}

void Module::init(uint64_t seed) {
  for (auto& [n, t] : named_parameters())
    if (!t.has_data())
      fail("nn", "param '", t.name(), "' ", t.shape().str(),
           " has no memory: call allocate(backend) first");
  init_tree(seed);
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, m] : children_) m->train(on);
}

Tensor Module::dropout_seed_tensor() {
  if (!seed_.defined()) seed_ = ctx_->tensor(i32, {1}, prefix_ + "dropout_seed");
  return seed_;
}

uint64_t Module::path_seed() const { return hash_name(prefix_); }

std::vector<Tensor> Module::dropout_seeds() const {
  std::vector<Tensor> out;
  if (seed_.defined()) out.push_back(seed_);
  for (const auto& [n, m] : children_)
    for (Tensor t : m->dropout_seeds()) out.push_back(t);
  return out;
}

void Module::set_dropout_step(int64_t step) {
  const int32_t v = int32_t(uint32_t(uint64_t(step) & 0xffffffffu));
  for (Tensor t : dropout_seeds())
    if (t.has_data()) t.set<int32_t>({v});
}

}  // namespace kiln::nn
