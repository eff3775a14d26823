// kiln::cpu node plans: which barriers CpuBackend::compute needs between the
// nodes of a list. Every thread walks the same steps; a barrier goes before a
// node only when it touches memory that a node since the last barrier touches
// in a conflicting way (read after write, write after read, write after
// write), judged from the byte ranges of the nodes' data and their sources'
// (views included: the memory planner reuses buffers, so unrelated tensors can
// share bytes); nodes that do not conflict may also run out of list order.
// Without the barrier a thread that finished its share of one node starts on
// the next at once.
//
//   NodePlan plan = plan_nodes(nodes, serial);
//   for (step : plan.steps) { if (step.barrier_before) t.barrier(); run(step); }
//
// The plan depends only on the nodes (their ops, shapes, strides and data
// pointers), so it is the same on every thread: kernels that hold barriers
// (gemm, reductions: collective) are entered by all threads in the same order.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

// Bytes [lo, hi) of memory; empty when lo == hi.
struct ByteRange {
  uintptr_t lo = 0, hi = 0;
  bool overlaps(const ByteRange& o) const { return lo < o.hi && o.lo < hi && lo < hi; }
};

// The smallest range holding every element of t (its strides may be negative,
// zero or leave gaps); empty for a tensor without memory or elements. Quantized
// tensors (blocks) take their memory owner's whole range.
ByteRange byte_range(const TensorNode* t);

// The memory a node's kernel reads and writes. A COMPUTE kernel writes its
// output and reads its sources; an ALIAS kernel updates memory in place: src0
// (ACCUMULATE, MATMUL_ACC), plus the moments (ADAMW_STEP: src2, src3) or the
// momentum buffer (SGD_STEP with 4 sources: src2); for any other ALIAS op every
// source counts as written.
struct NodeAccess {
  std::vector<ByteRange> reads, writes;
  void clear() {
    reads.clear();
    writes.clear();
  }
};
void node_access(const TensorNode* n, NodeAccess& out);  // appends to out

// A union of byte ranges, kept as sorted disjoint intervals (touching or
// overlapping ranges merge), so a query costs a binary search however many
// ranges went in.
class RangeSet {
 public:
  bool overlaps(const ByteRange& r) const;
  void add(const ByteRange& r);
  void add(const RangeSet& o);
  void clear() { v_.clear(); }
  bool empty() const { return v_.empty(); }
  size_t intervals() const { return v_.size(); }

 private:
  std::vector<ByteRange> v_;
};

// The bytes some nodes read and write.
class HazardSet {
 public:
  // True when a, run concurrently with what was added, could race: a writes
  // bytes something here reads or writes, or reads bytes something here writes.
  bool conflicts(const NodeAccess& a) const;
  void add(const NodeAccess& a);
  void add(const HazardSet& o);
  void clear();
  bool empty() const { return reads_.empty() && writes_.empty(); }

 private:
  RangeSet reads_, writes_;
};

// One step of a plan: nodes order[first, first + count) of the list. A
// parallel step (serial == false, count == 1) runs its node on every thread; a
// serial step runs its nodes in order on thread `thread` alone (small nodes),
// and the other threads go straight on to the next step.
struct NodeStep {
  uint32_t first = 0, count = 0;
  bool serial = false;
  bool barrier_before = false;  // all threads meet before this step
  int thread = 0;               // a serial step's thread
};

struct NodePlan {
  std::vector<uint32_t> order;  // node indices in the order they run
  std::vector<NodeStep> steps;
  int barriers() const;
};

// The plan for `nodes` on n_threads threads; serial[i] says node i runs on one
// thread alone. Nodes are put in levels with a barrier between consecutive
// levels: each node goes to the lowest level above every earlier node it
// conflicts with, except that a serial node may join the level of serial
// nodes it conflicts with: such a chain runs on one thread, in list order. So
// independent nodes run side by side even when the list has others between
// them, and results stay the same as in list order (two nodes that could race
// keep their order, separated by a barrier or on one thread). Within a level
// the parallel nodes run first, then each thread's serial step: chains of
// serial nodes go to the thread with the least serial work so far (elements
// touched). The first level has no barrier (a pool run starts in sync), and
// none is needed after the last (run() joins the threads). Planning is
// bounded: a node goes no lower than kLookback levels below the top, and a
// level takes at most kMaxLevelNodes parallel nodes and chains (a node that
// would start another goes up a level; a chain itself may grow without end).
constexpr size_t kLookback = 16;
constexpr size_t kMaxLevelNodes = 64;
NodePlan plan_nodes(std::span<TensorNode* const> nodes, const std::vector<bool>& serial,
                    int n_threads);

}  // namespace kiln::cpu
