// Scheduler step 2: splits, copies, shadows and the allocators' execution order.
//
// A node that reads a copy is never rewired: the scheduler computes a shadow
// instead, a copy of the node's metadata whose sources point at the copies and
// whose data is the user node's (set after allocation). The allocators plan the
// user's node (it owns the memory) and, right after it, its shadow (it reads the
// copies, so they stay alive until then).
#include "kiln/ext/op_builder.h"
#include "sched/sched_impl.h"

namespace kiln::sched_detail {

namespace {

// A fresh contiguous tensor in the scheduler's own storage, copied from `from`.
TensorNode* new_copy(Schedule& s, TensorNode* from) {
  TensorNode& c = s.own.emplace_back();
  c.id = from->id;
  c.name = from->name;
  c.dtype = from->dtype;
  c.shape = from->shape;
  c.stride = detail::contiguous_strides(from->shape, from->dtype);  // blocks for q8_0/q4_0
  c.op = Op::COPY;
  c.src[0] = from;
  c.n_src = 1;
  c.ctx = from->ctx;
  return &c;
}

}  // namespace

void split(Schedule& s, const Env& c) {
  const std::vector<Backend*>& be = c.backends;

  // Runs of consecutive compute/alias nodes on one backend. Views compute
  // nothing, so they never break a run.
  for (size_t k = 0; k < s.nodes.size(); ++k) {
    TensorNode* n = s.nodes[k];
    const OpKind kind = op_kind(n->op);
    if (kind != OpKind::COMPUTE && kind != OpKind::ALIAS) continue;
    const int b = s.where.at(n);
    if (s.splits.empty() || s.splits.back().backend != b) {
      s.splits.emplace_back();
      s.splits.back().backend = b;
      s.splits.back().first = int(k);
    }
    s.splits.back().last = int(k);
    s.splits.back().user_nodes.push_back(n);
  }

  // Copies: a source in memory the split's backend cannot read. A copy is made
  // once, before the first split that needs it, and later splits on the same
  // memory read it too (the allocators keep it alive until its last reader).
  // Keyed by memory type: (source, memory) -> what to read instead.
  std::unordered_map<const BufferType*, std::unordered_map<const TensorNode*, TensorNode*>> cache;
  std::unordered_map<const TensorNode*, TensorNode*> shadow_of;
  for (Split& sp : s.splits) {
    const BufferType* mine = &be[size_t(sp.backend)]->buffer_type();
    std::unordered_map<const TensorNode*, TensorNode*>& repl = cache[mine];
    auto copy_of = [&](TensorNode* from) {
      auto it = repl.find(from);
      if (it != repl.end()) return it->second;
      TensorNode* to = new_copy(s, from);
      sp.copies.push_back({from, to});
      repl[from] = to;
      return to;
    };
    for (TensorNode* n : sp.user_nodes) {
      std::array<TensorNode*, kMaxSrc> src = n->src;
      bool changed = false;
      for (int i = 0; i < n->n_src; ++i) {
        TensorNode* x = n->src[i];
        if (!x) continue;
        // An alias updates src0 in place; assign() put it where src0 lives.
        if (i == 0 && op_kind(n->op) == OpKind::ALIAS) continue;
        if (same_memory(memory_of(s, c, x), mine)) continue;
        changed = true;
        auto it = repl.find(x);
        if (it != repl.end()) {
          src[size_t(i)] = it->second;
        } else if (x->is_contiguous()) {
          src[size_t(i)] = copy_of(x);
        } else {
          // A strided view (x.T()): copy the memory it views, view the copy alike.
          TensorNode* o = owner_of(x);
          KILN_ASSERT(o->is_contiguous());
          TensorNode* to = copy_of(o);
          TensorNode& v = s.own.emplace_back(*x);
          v.view_src = to;
          v.src = {to, nullptr, nullptr};
          v.n_src = 1;
          v.data = nullptr;
          v.buffer = nullptr;
          v.flags = 0;
          sp.copy_views.push_back(&v);
          repl[x] = &v;
          src[size_t(i)] = &v;
        }
      }
      if (op_kind(n->op) == OpKind::ALIAS) {
        // n rewrites its target's memory: copies taken before are stale now.
        const TensorNode* target = owner_of(n);
        for (auto& [mem, m] : cache)
          std::erase_if(m, [&](const auto& kv) { return owner_of(kv.first) == target; });
      }
      if (!changed) {
        sp.run.push_back(n);
        continue;
      }
      TensorNode& sh = s.own.emplace_back(*n);
      sh.src = src;
      s.shadows.emplace_back(&sh, n);
      shadow_of[n] = &sh;
      sp.run.push_back(&sh);
    }
    s.n_copies += sp.copies.size();
  }

  // Which allocator places what: every non-view tensor the scheduler assigned
  // (not pre-allocated ones), and the copies.
  for (const auto& [t, b] : s.where)
    if (!t->view_src && !s.preallocated.count(t)) s.slot_of[t] = c.slot_of_backend[size_t(b)];
  for (const Split& sp : s.splits)
    for (const Copy& cp : sp.copies) s.slot_of[cp.to] = c.slot_of_backend[size_t(sp.backend)];

  // Execution order: a split's copies (and views of them) just before its first
  // node; each shadow right after its user node.
  size_t si = 0;
  for (size_t k = 0; k < s.nodes.size(); ++k) {
    TensorNode* n = s.nodes[k];
    if (si < s.splits.size() && int(k) == s.splits[si].first) {
      for (const Copy& cp : s.splits[si].copies) s.plan_nodes.push_back(cp.to);
      for (TensorNode* v : s.splits[si].copy_views) s.plan_nodes.push_back(v);
      ++si;
    }
    s.plan_nodes.push_back(n);
    auto it = shadow_of.find(n);
    if (it != shadow_of.end()) s.plan_nodes.push_back(it->second);
  }
}

}  // namespace kiln::sched_detail
