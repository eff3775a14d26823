#include "backends/cpu/node_plan.h"

#include "kiln/tensor.h"

namespace kiln::cpu {

ByteRange byte_range(const TensorNode* t) {
  if (!t || !t->data || t->numel() == 0) return {};
  if (is_quantized(t->dtype)) {  // strides count blocks: take the owner's bytes
    const TensorNode* o = t->view_src ? t->view_src : t;
    if (!o->data) return {};
    const auto lo = reinterpret_cast<uintptr_t>(o->data);
    return {lo, lo + o->nbytes()};
  }
  auto lo = reinterpret_cast<intptr_t>(t->data), hi = lo;
  for (int d = 0; d < t->shape.ndim(); ++d) {
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

NodePlan plan_nodes(std::span<TensorNode* const> nodes, const std::vector<bool>& serial) {
  struct Level {
    HazardSet par, ser;  // ranges of its parallel nodes, of its serial nodes
    std::vector<uint32_t> par_nodes, ser_nodes;
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
      if (s && levels[l].ser.conflicts(acc)) {  // after it on thread 0
        at = l;
        break;
      }
    }
    if (at == levels.size()) levels.emplace_back();
    Level& lv = levels[at];
    (s ? lv.ser : lv.par).add(acc);
    (s ? lv.ser_nodes : lv.par_nodes).push_back(uint32_t(i));
  }
  NodePlan plan;
  plan.order.reserve(nodes.size());
  for (size_t l = 0; l < levels.size(); ++l) {
    bool first = true;
    for (uint32_t i : levels[l].par_nodes) {
      plan.steps.push_back({uint32_t(plan.order.size()), 1, false, l > 0 && first});
      plan.order.push_back(i);
      first = false;
    }
    if (!levels[l].ser_nodes.empty()) {
      plan.steps.push_back({uint32_t(plan.order.size()), uint32_t(levels[l].ser_nodes.size()), true,
                            l > 0 && first});
      plan.order.insert(plan.order.end(), levels[l].ser_nodes.begin(), levels[l].ser_nodes.end());
    }
  }
  return plan;
}

}  // namespace kiln::cpu
