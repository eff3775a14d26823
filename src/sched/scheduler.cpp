// kiln::Scheduler: builds a Schedule (assign.cpp, split.cpp), allocates it with
// one GraphAllocator per buffer type, runs it.
#include <algorithm>

#include "kiln/ext/sched.h"
#include "sched/sched_impl.h"

namespace kiln {

using sched_detail::owner_of;
using sched_detail::Schedule;

struct Scheduler::Impl {
  std::vector<Backend*> backends;
  SchedulerOptions opt;
  std::vector<std::unique_ptr<GraphAllocator>> slots;  // one per distinct buffer type
  std::vector<int> slot_of_backend;
  // Every buffer the allocators ever had (a tensor of an older graph may still
  // point into a replaced one): memory the scheduler placed, never "pre-allocated".
  std::unordered_set<const Buffer*> own_buffers;
  Schedule s;
  bool allocated = false;  // s is the schedule of the last alloc()

  sched_detail::Env env() const {
    return {backends, slot_of_backend,
            [this](const Buffer* b) { return b && own_buffers.count(b) != 0; }, opt.expand};
  }

  void remember_buffers() {
    for (auto& a : slots)
      if (a->buffer()) own_buffers.insert(a->buffer());
  }

  void build(const Graph& g) {
    s.clear();
    s.nodes = g.nodes();
    s.leafs = g.leafs();
    const sched_detail::Env e = env();
    sched_detail::assign(s, e);
    sched_detail::split(s, e);
  }

  NodeList list_for(int slot) const {
    NodeList l(std::span<TensorNode* const>(s.plan_nodes), std::span<TensorNode* const>(s.leafs));
    l.mine = [this, slot](const TensorNode* t) {
      auto it = s.slot_of.find(t);
      return it != s.slot_of.end() && it->second == slot;
    };
    return l;
  }

  bool slot_used(int slot) const {
    return std::any_of(s.slot_of.begin(), s.slot_of.end(),
                       [&](const auto& p) { return p.second == slot; });
  }

  bool same_graph(const Graph& g) const {
    return allocated && g.nodes() == s.nodes && g.leafs() == s.leafs;
  }
};

Scheduler::Scheduler(std::vector<Backend*> backends, SchedulerOptions opt)
    : impl_(std::make_unique<Impl>()) {
  if (backends.empty()) fail("sched", "a scheduler needs at least one backend");
  for (size_t i = 0; i < backends.size(); ++i) {
    if (!backends[i]) fail("sched", "backend ", i, " is null");
    for (size_t j = 0; j < i; ++j)
      if (backends[j] == backends[i])
        fail("sched", "backend ", i, " (", backends[i]->name(), ") is listed twice");
  }
  impl_->backends = std::move(backends);
  impl_->opt = opt;
  for (Backend* b : impl_->backends) {
    int slot = -1;
    for (size_t k = 0; k < impl_->slots.size(); ++k)
      if (&impl_->slots[k]->buffer_type() == &b->buffer_type()) slot = int(k);
    if (slot < 0) {
      slot = int(impl_->slots.size());
      impl_->slots.push_back(std::make_unique<GraphAllocator>(b->buffer_type(), opt.alloc));
    }
    impl_->slot_of_backend.push_back(slot);
  }
}

Scheduler::~Scheduler() = default;

void Scheduler::reserve(const Graph& g) {
  Impl& m = *impl_;
  m.build(g);
  m.allocated = false;  // no memory was assigned for this schedule
  for (size_t k = 0; k < m.slots.size(); ++k)
    if (m.slot_used(int(k))) m.slots[k]->reserve(m.list_for(int(k)));
  m.remember_buffers();
}

bool Scheduler::alloc(const Graph& g) {
  Impl& m = *impl_;
  m.allocated = false;
  m.build(g);
  Schedule& s = m.s;
  // A tensor the scheduler placed in one allocator's buffer that now belongs to
  // another allocator (or sits in a replaced buffer) starts over without memory.
  for (const auto& [t, slot] : s.slot_of) {
    TensorNode* tn = const_cast<TensorNode*>(t);
    if (tn->buffer && m.own_buffers.count(tn->buffer) &&
        tn->buffer != m.slots[size_t(slot)]->buffer()) {
      tn->data = nullptr;
      tn->buffer = nullptr;
    }
  }
  bool grew = false;
  for (size_t k = 0; k < m.slots.size(); ++k)
    if (m.slot_used(int(k))) grew |= m.slots[k]->alloc(m.list_for(int(k)));
  m.remember_buffers();
  // Views (the graph's and those of copies) after all their owners got memory;
  // then the shadows compute into their user node's memory.
  for (TensorNode* t : s.plan_nodes) {
    if (!t->view_src) continue;
    const TensorNode* o = owner_of(t);
    t->data = o->data ? static_cast<char*>(o->data) + t->view_offs : nullptr;
    t->buffer = o->buffer;
  }
  for (auto& [sh, user] : s.shadows) {
    if (sh->view_src) continue;  // an alias shadow: set with the views above
    sh->data = user->data;
    sh->buffer = user->buffer;
  }
  m.allocated = true;
  return grew;
}

void Scheduler::compute(const Graph& g) {
  Impl& m = *impl_;
  if (!m.same_graph(g)) alloc(g);
  for (const TensorNode* l : m.s.leafs)
    if (!l->data && l->numel() > 0)
      fail("sched", "leaf ", l->label(), " ", l->shape.str(), " has no memory");
  for (const sched_detail::Split& sp : m.s.splits) {
    for (const sched_detail::Copy& c : sp.copies)
      if (c.from->numel() > 0) copy_tensor(c.from, c.to);
    Backend* b = m.backends[size_t(sp.backend)];
    b->compute(std::span<TensorNode* const>(sp.run));
    b->synchronize();  // the next split may copy its results
  }
}

std::string Scheduler::dump() const { return sched_detail::dump_schedule(impl_->s, impl_->env()); }

const std::vector<Backend*>& Scheduler::backends() const { return impl_->backends; }

std::vector<SplitInfo> Scheduler::splits() const {
  std::vector<SplitInfo> out;
  for (const sched_detail::Split& sp : impl_->s.splits) {
    SplitInfo si;
    si.backend = sp.backend;
    si.first = sp.first;
    si.last = sp.last;
    si.nodes = sp.user_nodes;
    for (const sched_detail::Copy& c : sp.copies) si.copied.push_back(c.from);
    out.push_back(std::move(si));
  }
  return out;
}

size_t Scheduler::n_splits() const { return impl_->s.splits.size(); }
size_t Scheduler::n_copies() const { return impl_->s.n_copies; }

Backend* Scheduler::backend_of(const TensorNode* t) const {
  const Schedule& s = impl_->s;
  if (!t) return nullptr;
  auto it = s.where.find(t);
  if (it == s.where.end()) it = s.where.find(owner_of(t));
  return it == s.where.end() ? nullptr : impl_->backends[size_t(it->second)];
}

size_t Scheduler::buffer_size(const Backend& b) const {
  for (size_t i = 0; i < impl_->backends.size(); ++i)
    if (impl_->backends[i] == &b)
      return impl_->slots[size_t(impl_->slot_of_backend[i])]->buffer_size();
  return 0;
}

}  // namespace kiln
