#include "backends/cpu/node_plan.h"

#include <algorithm>
#include <iterator>
#include <utility>

#include "kiln/tensor.h"

namespace kiln::cpu {

ByteRange byte_range(const TensorNode* t) {
  if (!t || !t->data) return {};
  if (is_quantized(t->dtype)) {  // strides count blocks: take the owner's bytes
    const TensorNode* o = t->view_src ? t->view_src : t;
    if (!o->data || t->numel() == 0) return {};
    const auto lo = reinterpret_cast<uintptr_t>(o->data);
    return {lo, lo + o->nbytes()};
  }
  auto lo = reinterpret_cast<intptr_t>(t->data), hi = lo;
  for (int d = 0; d < t->shape.ndim(); ++d) {  // (no numel(): this runs per compute)
    if (t->shape[d] == 0) return {};
    const intptr_t span = intptr_t(t->shape[d] - 1) * intptr_t(t->stride[d]);
    (span < 0 ? lo : hi) += span;
  }
  return {uintptr_t(lo), uintptr_t(hi) + t->elem_size()};
}

namespace {
// Bit i: the kernel writes src i.
uint32_t written_sources(const TensorNode* n) {
  if (op_kind(n->op) != OpKind::ALIAS) return 0;
  switch (n->op) {
    case Op::ACCUMULATE:
    case Op::MATMUL_ACC: return 1u << 0;
    case Op::ADAMW_STEP:
    case Op::ADAMW_STEP_MULTI: return 1u << 0 | 1u << 2 | 1u << 3;
    case Op::SGD_STEP: return n->n_src == 4 ? (1u << 0 | 1u << 2) : 1u << 0;
    default: return ~0u;
  }
}
}  // namespace

void node_access(const TensorNode* n, NodeAccess& out) {
  const uint32_t written = written_sources(n);
  out.writes.push_back(byte_range(n));
  for (int i = 0; i < n->n_src; ++i) {
    if (!n->src[i]) continue;
    const ByteRange r = byte_range(n->src[i]);
    out.reads.push_back(r);
    if (written >> i & 1) out.writes.push_back(r);
  }
}

bool RangeSet::overlaps(const ByteRange& r) const {
  if (r.lo >= r.hi) return false;
  // The last interval starting before r ends is the only one that can reach
  // into r (the intervals are disjoint and sorted).
  auto it = std::lower_bound(v_.begin(), v_.end(), r.hi,
                             [](const ByteRange& x, uintptr_t hi) { return x.lo < hi; });
  return it != v_.begin() && std::prev(it)->hi > r.lo;
}

void RangeSet::add(const ByteRange& r) {
  if (r.lo >= r.hi) return;
  // Intervals [first, last) touch or overlap r: replace them by their union.
  auto first = std::lower_bound(v_.begin(), v_.end(), r.lo,
                                [](const ByteRange& x, uintptr_t lo) { return x.hi < lo; });
  auto last = first;
  ByteRange u = r;
  for (; last != v_.end() && last->lo <= r.hi; ++last) {
    u.lo = std::min(u.lo, last->lo);
    u.hi = std::max(u.hi, last->hi);
  }
  if (first == last) {
    v_.insert(first, u);
  } else {
    *first = u;
    v_.erase(first + 1, last);
  }
}

void RangeSet::add(const RangeSet& o) {
  for (const ByteRange& r : o.v_) add(r);
}

bool HazardSet::conflicts(const NodeAccess& a) const {
  for (const ByteRange& w : a.writes)
    if (writes_.overlaps(w) || reads_.overlaps(w)) return true;
  for (const ByteRange& r : a.reads)
    if (writes_.overlaps(r)) return true;
  return false;
}

void HazardSet::add(const NodeAccess& a) {
  for (const ByteRange& r : a.reads) reads_.add(r);
  for (const ByteRange& w : a.writes) writes_.add(w);
}

void HazardSet::add(const HazardSet& o) {
  reads_.add(o.reads_);
  writes_.add(o.writes_);
}

void HazardSet::clear() {
  reads_.clear();
  writes_.clear();
}

int NodePlan::barriers() const {
  int b = 0;
  for (const NodeStep& s : steps) b += s.barrier_before;
  return b;
}

namespace {
// Elements a serial node touches: its share of a thread's serial work.
int64_t cost_of(const TensorNode* n) {
  int64_t c = n->numel();
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i]) c += n->src[i]->numel();
  return c;
}
}  // namespace

NodePlan plan_nodes(std::span<TensorNode* const> nodes, const std::vector<bool>& serial,
                    int n_threads) {
  struct Chain {
    HazardSet set;
    uint32_t into;  // the chain it was merged into (itself while live)
  };
  struct Level {
    HazardSet par, ser;  // ranges of its parallel nodes, of its serial nodes
    std::vector<uint32_t> par_nodes;
    std::vector<std::pair<uint32_t, uint32_t>> ser_nodes;  // (node, chain)
    std::vector<Chain> chains;
    std::vector<uint32_t> live;  // chains not merged into another
    size_t width() const { return par_nodes.size() + live.size(); }
    uint32_t root(uint32_t c) const {
      while (chains[c].into != c) c = chains[c].into;
      return c;
    }
  };
  std::vector<Level> levels;
  std::vector<uint32_t> joined;
  NodeAccess acc;
  for (size_t i = 0; i < nodes.size(); ++i) {
    acc.clear();
    node_access(nodes[i], acc);
    const bool s = serial[i];
    const size_t floor = levels.size() > kLookback ? levels.size() - kLookback : 0;
    size_t at = floor;
    bool join = false;  // a serial node joining chains of level `at`
    for (size_t l = levels.size(); l-- > floor;) {
      if (levels[l].par.conflicts(acc) || (!s && levels[l].ser.conflicts(acc))) {
        at = l + 1;
        break;
      }
      if (s && levels[l].ser.conflicts(acc)) {  // after them, on their thread
        at = l;
        join = true;
        break;
      }
    }
    // A full level takes no new node or chain: the next one up (also free of
    // conflicts, or new) does.
    if (!join)
      while (at < levels.size() && levels[at].width() >= kMaxLevelNodes) ++at;
    if (at == levels.size()) levels.emplace_back();
    Level& lv = levels[at];
    if (!s) {
      lv.par.add(acc);
      lv.par_nodes.push_back(uint32_t(i));
      continue;
    }
    // The live chains it conflicts with merge into the first of them.
    joined.clear();
    if (join)
      for (uint32_t c : lv.live)
        if (lv.chains[c].set.conflicts(acc)) joined.push_back(c);
    uint32_t chain;
    if (joined.empty()) {
      chain = uint32_t(lv.chains.size());
      lv.chains.push_back({HazardSet{}, chain});
      lv.live.push_back(chain);
    } else {
      chain = joined[0];
      for (size_t k = 1; k < joined.size(); ++k) {
        lv.chains[chain].set.add(lv.chains[joined[k]].set);
        lv.chains[joined[k]].set.clear();
        lv.chains[joined[k]].into = chain;
        lv.live.erase(std::find(lv.live.begin(), lv.live.end(), joined[k]));
      }
    }
    lv.chains[chain].set.add(acc);
    lv.ser.add(acc);
    lv.ser_nodes.push_back({uint32_t(i), chain});
  }

  NodePlan plan;
  plan.order.reserve(nodes.size());
  const int nt = n_threads < 1 ? 1 : n_threads;
  std::vector<int64_t> load(static_cast<size_t>(nt));
  std::vector<int> thread_of;
  std::vector<std::vector<uint32_t>> per_thread(static_cast<size_t>(nt));
  for (size_t l = 0; l < levels.size(); ++l) {
    Level& lv = levels[l];
    bool first = true;
    for (uint32_t i : lv.par_nodes) {
      plan.steps.push_back({uint32_t(plan.order.size()), 1, false, l > 0 && first, 0});
      plan.order.push_back(i);
      first = false;
    }
    if (lv.ser_nodes.empty()) continue;
    // Each chain (when its first node comes) to the thread with the least
    // serial work in this level so far.
    thread_of.assign(lv.chains.size(), -1);
    std::fill(load.begin(), load.end(), 0);
    for (auto& v : per_thread) v.clear();
    for (const auto& [node, c] : lv.ser_nodes) {
      const uint32_t r = lv.root(c);
      if (thread_of[r] < 0)
        thread_of[r] = int(std::min_element(load.begin(), load.end()) - load.begin());
      const int th = thread_of[r];
      load[size_t(th)] += cost_of(nodes[node]);
      per_thread[size_t(th)].push_back(node);
    }
    for (int th = 0; th < nt; ++th) {
      const auto& v = per_thread[size_t(th)];
      if (v.empty()) continue;
      plan.steps.push_back(
          {uint32_t(plan.order.size()), uint32_t(v.size()), true, l > 0 && first, th});
      plan.order.insert(plan.order.end(), v.begin(), v.end());
      first = false;
    }
  }
  return plan;
}

}  // namespace kiln::cpu
