#include "backends/cpu/node_plan.h"

#include <algorithm>

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
    case Op::ADAMW_STEP: return 1u << 0 | 1u << 2 | 1u << 3;
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

namespace {
bool any_overlap(const std::vector<ByteRange>& a, const std::vector<ByteRange>& b) {
  for (const ByteRange& x : a)
    for (const ByteRange& y : b)
      if (x.overlaps(y)) return true;
  return false;
}
}  // namespace

bool conflict(const NodeAccess& a, const NodeAccess& b) {
  return any_overlap(a.writes, b.writes) || any_overlap(a.writes, b.reads) ||
         any_overlap(a.reads, b.writes);
}

bool HazardSet::conflicts(const NodeAccess& a) const {
  return any_overlap(a.writes, writes_) || any_overlap(a.writes, reads_) ||
         any_overlap(a.reads, writes_);
}

void HazardSet::add(const NodeAccess& a) {
  reads_.insert(reads_.end(), a.reads.begin(), a.reads.end());
  writes_.insert(writes_.end(), a.writes.begin(), a.writes.end());
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
  struct Serial {
    uint32_t node;
    uint32_t chain;  // index (in the level) of a serial node it must follow on one thread
    NodeAccess acc;
  };
  struct Level {
    HazardSet par, ser;  // ranges of its parallel nodes, of its serial nodes
    std::vector<uint32_t> par_nodes;
    std::vector<Serial> ser_nodes;
  };
  std::vector<Level> levels;
  NodeAccess acc;
  for (size_t i = 0; i < nodes.size(); ++i) {
    acc.clear();
    node_access(nodes[i], acc);
    const bool s = serial[i];
    const size_t floor = levels.size() > kLookback ? levels.size() - kLookback : 0;
    size_t at = floor;
    for (size_t l = levels.size(); l-- > floor;) {
      if (levels[l].par.conflicts(acc) || (!s && levels[l].ser.conflicts(acc))) {
        at = l + 1;
        break;
      }
      if (s && levels[l].ser.conflicts(acc)) {  // after them, on their thread
        at = l;
        break;
      }
    }
    if (at == levels.size()) levels.emplace_back();
    Level& lv = levels[at];
    if (!s) {
      lv.par.add(acc);
      lv.par_nodes.push_back(uint32_t(i));
      continue;
    }
    // Chains: union-find over the serial nodes of the level that conflict.
    auto root = [&lv](uint32_t k) {
      while (lv.ser_nodes[k].chain != k) k = lv.ser_nodes[k].chain;
      return k;
    };
    const uint32_t me = uint32_t(lv.ser_nodes.size());
    uint32_t chain = me;
    for (uint32_t k = 0; k < me; ++k) {
      if (!conflict(lv.ser_nodes[k].acc, acc)) continue;
      const uint32_t r = root(k);
      if (chain == me) {
        chain = r;
      } else if (r != chain) {
        lv.ser_nodes[std::max(r, chain)].chain = std::min(r, chain);
        chain = std::min(r, chain);
      }
    }
    lv.ser.add(acc);
    lv.ser_nodes.push_back({uint32_t(i), chain, acc});
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
    thread_of.assign(lv.ser_nodes.size(), -1);
    std::fill(load.begin(), load.end(), 0);
    for (auto& v : per_thread) v.clear();
    for (uint32_t k = 0; k < lv.ser_nodes.size(); ++k) {
      uint32_t r = k;
      while (lv.ser_nodes[r].chain != r) r = lv.ser_nodes[r].chain;
      if (thread_of[r] < 0)
        thread_of[r] = int(std::min_element(load.begin(), load.end()) - load.begin());
      const int th = thread_of[r];
      load[size_t(th)] += cost_of(nodes[lv.ser_nodes[k].node]);
      per_thread[size_t(th)].push_back(lv.ser_nodes[k].node);
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
