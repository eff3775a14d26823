// Step 1 of planning: liveness and in-place decisions (see graph_plan.h).
//
// Consumer counts are kept per memory owner: an edge node -> src counts for the
// tensor whose memory src uses, so a view's consumers keep the viewed tensor
// alive and a view node itself is one consumer of its source.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "alloc/graph_plan.h"

namespace kiln::alloc_detail {

namespace {

struct Info {
  bool in_list = false;  // a node or leaf of the list
  bool ours = false;     // placed by this allocator
  bool keep = false;     // lives to the end
  int refs = 0;          // consumer edges not yet run
  int block = -1;        // the block it holds now (-1: none, or freed/handed over)
};

class Planner {
 public:
  Planner(const NodeList& list, const BufferType& type, const Buffer* own,
          const GraphAllocatorOptions& opt)
      : list_(list),
        type_(type),
        own_(own),
        opt_(opt),
        align_(std::max<size_t>(type.alignment(), 1)) {}

  Plan run() {
    collect();
    count();
    walk();
    return std::move(plan_);
  }

 private:
  size_t block_size(const TensorNode* t) const {
    const size_t n = std::max<size_t>(type_.alloc_size(t), 1);
    return (n + align_ - 1) / align_ * align_;
  }
  Info& info(const TensorNode* t) { return info_[t]; }

  // Leaves first (the given ones, then those found among the nodes' sources),
  // then which tensors this allocator places.
  void collect() {
    std::unordered_set<const TensorNode*> seen;
    auto add_leaf = [&](TensorNode* l) {
      if (l && seen.insert(l).second) leafs_.push_back(l);
    };
    for (TensorNode* l : list_.leafs) add_leaf(l);
    for (TensorNode* n : list_.nodes) {
      if (op_kind(n->op) == OpKind::LEAF) add_leaf(n);
      for (int i = 0; i < n->n_src; ++i)
        if (n->src[i] && op_kind(n->src[i]->op) == OpKind::LEAF) add_leaf(n->src[i]);
      if (n->view_src && op_kind(owner_of(n)->op) == OpKind::LEAF) add_leaf(owner_of(n));
    }
    auto classify = [&](TensorNode* t) {
      Info& in = info(t);
      in.in_list = true;
      // A tensor with memory outside our buffer is pre-allocated: not ours.
      in.ours = !t->is_view() && (!list_.mine || list_.mine(t)) &&
                (t->data == nullptr || (own_ && t->buffer == own_));
    };
    for (TensorNode* l : leafs_) classify(l);
    for (TensorNode* n : list_.nodes)
      if (op_kind(n->op) != OpKind::LEAF) classify(n);
  }

  void count() {
    for (TensorNode* n : list_.nodes)
      for (int i = 0; i < n->n_src; ++i)
        if (TensorNode* s = n->src[i]) info(owner_of(s)).refs++;
    // Keep-alive: leaves, flagged tensors, and anything a flagged view aliases.
    auto mark = [&](TensorNode* t) {
      if ((t->flags & kKeepFlags) || (list_.keep && list_.keep(t)) || !opt_.reuse)
        info(owner_of(t)).keep = true;
    };
    for (TensorNode* l : leafs_) {
      info(l).keep = true;
      mark(l);
    }
    for (TensorNode* n : list_.nodes) mark(n);
  }

  int new_block(TensorNode* t, int step) {
    const int b = int(plan_.blocks.size());
    plan_.blocks.push_back({block_size(t), step, -1, 0});
    plan_.events.push_back({b, true});
    return b;
  }

  void free_block(Info& in, int step) {
    plan_.blocks[size_t(in.block)].last = step;
    plan_.events.push_back({in.block, false});
    in.block = -1;
  }

  // May node n (at its step, before its sources are released) take over the block
  // of src0's memory owner?
  bool can_take_over(TensorNode* n) {
    if (!opt_.reuse || !opt_.inplace || !op_can_inplace(n->op) || n->n_src < 1 || !n->src[0])
      return false;
    TensorNode* s0 = n->src[0];
    TensorNode* o = owner_of(s0);
    const Info& oi = info(o);
    // refs == 1: this edge is the last reader of o's memory (a second edge of n
    // itself, e.g. add(x, x.T()), would read what n overwrites).
    if (!oi.ours || oi.keep || oi.block < 0 || oi.refs != 1) return false;
    if ((n->flags & kKeepFlags) || (s0->flags & kKeepFlags)) return false;
    // Element i of src0 and element i of n must be the same bytes of the block.
    if (s0->dtype != n->dtype || s0->nbytes() != n->nbytes() || !s0->is_contiguous() ||
        !n->is_contiguous())
      return false;
    if (s0 != o && s0->view_offs != 0) return false;
    return plan_.blocks[size_t(oi.block)].size == block_size(n);
  }

  void walk() {
    const int n_steps = int(list_.nodes.size());
    for (TensorNode* l : leafs_) {
      Info& in = info(l);
      if (!in.ours) continue;
      in.block = new_block(l, -1);
      plan_.tensors.emplace_back(l, in.block);
    }
    for (int k = 0; k < n_steps; ++k) {
      TensorNode* n = list_.nodes[size_t(k)];
      Info& ni = info(n);
      if (n->is_view()) {
        plan_.views.push_back(n);
      } else if (ni.ours && ni.block < 0 && op_kind(n->op) != OpKind::LEAF) {
        if (can_take_over(n)) {
          Info& oi = info(owner_of(n->src[0]));
          ni.block = oi.block;
          oi.block = -1;  // handed over: o's last reader is n, nothing frees it again
          plan_.stats.n_inplace++;
        } else {
          ni.block = new_block(n, k);
        }
        plan_.tensors.emplace_back(n, ni.block);
      }
      // Release sources whose last consumer was n, then n itself if nobody reads it.
      for (int i = 0; i < n->n_src; ++i) {
        if (!n->src[i]) continue;
        Info& si = info(owner_of(n->src[i]));
        if (--si.refs == 0 && si.ours && !si.keep && si.block >= 0) free_block(si, k);
      }
      if (ni.ours && ni.refs == 0 && !ni.keep && ni.block >= 0) free_block(ni, k);
    }
    for (Block& b : plan_.blocks)
      if (b.last < 0) b.last = n_steps;  // kept (or never released): to the end
    plan_.stats.n_steps = size_t(n_steps);
    plan_.stats.n_tensors = plan_.tensors.size();
    for (auto& [t, b] : plan_.tensors) plan_.stats.total_size += block_size(t);
  }

  const NodeList& list_;
  const BufferType& type_;
  const Buffer* own_;
  const GraphAllocatorOptions& opt_;
  size_t align_;
  std::vector<TensorNode*> leafs_;
  std::unordered_map<const TensorNode*, Info> info_;
  Plan plan_;
};

}  // namespace

Plan plan_liveness(const NodeList& list, const BufferType& type, const Buffer* own,
                   const GraphAllocatorOptions& opt) {
  return Planner(list, type, own, opt).run();
}

}  // namespace kiln::alloc_detail
