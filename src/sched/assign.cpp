// Scheduler step 1: every tensor of the graph -> a backend (rules in kiln/ext/sched.h).
#include <string>

#include "sched/sched_impl.h"

namespace kiln::sched_detail {

namespace {

// "node #7 'h' (matmul f32[64, 500])"
std::string describe(const TensorNode* n) {
  return "node " + n->label() + " (" + op_name(n->op) + " " + dtype_name(n->dtype) +
         n->shape.str() + ")";
}

class Assigner {
 public:
  Assigner(Schedule& s, const Env& c) : s_(s), c_(c), be_(c.backends) {}

  void run() {
    find_preallocated();
    index_consumers();
    for (size_t k = 0; k < s_.nodes.size(); ++k) assign_node(s_.nodes[k]);
    if (c_.expand) expand();
    assign_leaves();
    for (TensorNode* n : s_.nodes)  // views live (and "run") where their memory is
      if (n->view_src && op_kind(n->op) == OpKind::VIEW) s_.where[n] = s_.where.at(owner_of(n));
  }

 private:
  bool supports(int b, const TensorNode* n) const { return be_[size_t(b)]->supports_op(n); }

  // Backends that can use memory of `buf` directly: its own buffer type first,
  // then (for host memory) every host backend.
  std::vector<int> homes(const Buffer* buf) const {
    std::vector<int> h;
    for (size_t b = 0; b < be_.size(); ++b)
      if (&be_[b]->buffer_type() == &buf->type()) h.push_back(int(b));
    for (size_t b = 0; b < be_.size(); ++b)
      if (&be_[b]->buffer_type() != &buf->type() &&
          same_memory(&be_[b]->buffer_type(), &buf->type()))
        h.push_back(int(b));
    return h;
  }

  // Memory owners that already have memory the scheduler did not give them.
  void find_preallocated() {
    auto check = [&](const TensorNode* t) {
      const TensorNode* o = owner_of(t);
      if (!o->data || c_.scheduler_buffer(o->buffer)) return;
      if (!o->buffer)
        fail("sched", describe(o), " has data but no buffer: allocate it in a backend's buffer");
      const std::vector<int> h = homes(o->buffer);
      if (h.empty())
        fail("sched", describe(o), " lives in a '", o->buffer->type().name(),
             "' buffer, which none of the scheduler's backends can use");
      if (s_.preallocated.insert(o).second) s_.where[o] = h[0];
    };
    for (const TensorNode* l : s_.leafs) check(l);
    for (const TensorNode* n : s_.nodes) {
      check(n);
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i]) check(n->src[i]);
    }
  }

  bool preallocated(const TensorNode* t) const { return s_.preallocated.count(owner_of(t)) != 0; }

  // Compute/alias nodes reading each memory owner (through views), in order.
  void index_consumers() {
    for (TensorNode* n : s_.nodes) {
      const OpKind k = op_kind(n->op);
      if (k != OpKind::COMPUTE && k != OpKind::ALIAS) continue;
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i]) consumers_[owner_of(n->src[i])].push_back(n);
    }
  }

  int first_supporting(const TensorNode* n, const std::vector<int>& among) const {
    for (int b : among)
      if (supports(b, n)) return b;
    return -1;
  }

  [[noreturn]] void unsupported(const TensorNode* n, const char* why) const {
    std::string names;
    for (Backend* b : be_) names += (names.empty() ? "" : ", ") + std::string(b->name());
    fail("sched", describe(n), ": ", why, " (backends: ", names, ")");
  }

  void assign_node(TensorNode* n) {
    const OpKind kind = op_kind(n->op);
    if (kind != OpKind::COMPUTE && kind != OpKind::ALIAS) return;
    int b = -1;
    TensorNode* self = owner_of(n);  // an alias's memory is its target's
    if (preallocated(self)) {
      b = first_supporting(n, homes(self->buffer));
      if (b < 0)
        unsupported(n, "its memory is pre-allocated but no backend using that memory supports it");
      pinned_.insert(n);
    } else if (kind == OpKind::ALIAS && s_.where.count(self)) {
      // In place: must run where the tensor it updates lives.
      b = s_.where.at(self);
      if (!supports(b, n))
        unsupported(n, "updates a tensor in place on a backend that does not support it");
      pinned_.insert(n);
    }
    if (b < 0) {
      // Where a pre-allocated input lives (weights stay put; the op goes to them).
      for (int i = 0; i < n->n_src && b < 0; ++i)
        if (n->src[i] && preallocated(n->src[i]))
          b = first_supporting(n, homes(owner_of(n->src[i])->buffer));
      if (b >= 0) pinned_.insert(n);
    }
    if (b < 0) {
      for (size_t k = 0; k < be_.size() && b < 0; ++k)
        if (supports(int(k), n)) b = int(k);
      if (b < 0) unsupported(n, "no backend supports it");
    }
    s_.where[n] = b;
    if (kind == OpKind::ALIAS && !s_.where.count(self)) s_.where[self] = b;
  }

  // The memory a tensor lives in, or null for a leaf not placed yet.
  const BufferType* memory(const TensorNode* t) const {
    const TensorNode* o = owner_of(t);
    if (preallocated(o)) return &o->buffer->type();
    auto it = s_.where.find(o);
    return it == s_.where.end() ? nullptr : &be_[size_t(it->second)]->buffer_type();
  }

  // A node whose inputs and consumers all live in one memory other than its
  // backend's moves to a backend of that memory (when one supports it): that
  // saves copying the inputs in and the output back out.
  void expand() {
    for (int pass = 0; pass < 4; ++pass) {
      bool changed = false;
      for (TensorNode* n : s_.nodes) {
        const OpKind kind = op_kind(n->op);
        if (kind != OpKind::COMPUTE || pinned_.count(n)) continue;
        const BufferType* mem = nullptr;
        bool one = true;
        auto see = [&](const BufferType* m) {
          if (!m) return;
          if (!mem) mem = m;
          else if (!same_memory(mem, m)) one = false;
        };
        for (int i = 0; i < n->n_src; ++i)
          if (n->src[i]) see(memory(n->src[i]));
        auto it = consumers_.find(n);
        if (it != consumers_.end())
          for (const TensorNode* c : it->second) see(&be_[size_t(s_.where.at(c))]->buffer_type());
        const int b = s_.where.at(n);
        if (!mem || !one || same_memory(mem, &be_[size_t(b)]->buffer_type())) continue;
        for (size_t a = 0; a < be_.size(); ++a)
          if (same_memory(&be_[a]->buffer_type(), mem) && supports(int(a), n)) {
            s_.where[n] = int(a);
            changed = true;
            break;
          }
      }
      if (!changed) break;
    }
  }

  // Leaves the scheduler places go where their first consumer runs.
  void assign_leaves() {
    auto place = [&](TensorNode* l) {
      if (l->view_src || s_.where.count(l)) return;
      auto it = consumers_.find(l);
      s_.where[l] =
          it == consumers_.end() || it->second.empty() ? 0 : s_.where.at(it->second.front());
    };
    for (TensorNode* l : s_.leafs) place(l);
    for (TensorNode* n : s_.nodes) {
      if (op_kind(n->op) == OpKind::LEAF) place(n);
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i] && op_kind(owner_of(n->src[i])->op) == OpKind::LEAF)
          place(owner_of(n->src[i]));
    }
  }

  Schedule& s_;
  const Env& c_;
  const std::vector<Backend*>& be_;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> consumers_;
  std::unordered_set<const TensorNode*> pinned_;
};

}  // namespace

void assign(Schedule& s, const Env& c) { Assigner(s, c).run(); }

const BufferType* memory_of(const Schedule& s, const Env& c, const TensorNode* t) {
  const TensorNode* o = owner_of(t);
  if (s.preallocated.count(o)) return &o->buffer->type();
  return &c.backends[size_t(s.where.at(o))]->buffer_type();
}

}  // namespace kiln::sched_detail
