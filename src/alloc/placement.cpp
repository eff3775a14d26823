// Step 2 of planning: offsets for the blocks of a plan (see graph_plan.h).
//
// Several strategies; the smallest buffer wins (Placement::best):
//  - best-fit: replay the walk's alloc/free events through a TensorAllocator in
//    measure mode (what an online allocator would do);
//  - offline orders (by-size, by-end, by-start): place blocks one by one in a
//    fixed order, each in the tightest gap left by the already placed blocks whose
//    live intervals intersect its own. Knowing every lifetime in advance avoids
//    most of the fragmentation best-fit suffers when a long-lived block lands in
//    the middle of a large freed one. No single order is best for every graph
//    (by-size wins on the CNN and transformer, by-end on the MLP: see
//    docs/benchmarks.md), and each costs O(blocks^2) on small graphs, so all run.
// All are exact: the buffer size is the end of the highest block.
#include <algorithm>
#include <functional>
#include <numeric>

#include "alloc/graph_plan.h"

namespace kiln::alloc_detail {

namespace {

// The offline orders are quadratic in the number of blocks; above this the
// online best fit (linear in events times free-list length) is used alone.
constexpr size_t kMaxBlocksOffline = 8192;

size_t place_best_fit(std::vector<Block>& blocks, const std::vector<Event>& events, size_t align) {
  TensorAllocator ta(align, SIZE_MAX);
  for (const Event& e : events) {
    Block& b = blocks[size_t(e.block)];
    if (e.alloc) b.offset = ta.alloc(b.size);
    else ta.free(b.offset, b.size);
  }
  return ta.high_water();
}

// Offline placement in a given order: each block goes into the tightest gap left
// by the already placed blocks whose live intervals intersect its own; if none
// fits, on top of them.
size_t place_ordered(std::vector<Block>& blocks, const std::vector<size_t>& order) {
  std::vector<size_t> placed;  // block indices sorted by offset
  placed.reserve(blocks.size());
  size_t total = 0;
  for (size_t i : order) {
    Block& b = blocks[i];
    size_t cursor = 0, best = SIZE_MAX, best_gap = SIZE_MAX;
    for (size_t j : placed) {
      const Block& c = blocks[j];
      if (c.first > b.last || b.first > c.last) continue;  // never live together
      if (c.offset > cursor) {
        const size_t gap = c.offset - cursor;
        if (gap >= b.size && gap < best_gap) {
          best = cursor;
          best_gap = gap;
        }
      }
      cursor = std::max(cursor, c.offset + c.size);
    }
    b.offset = best != SIZE_MAX ? best : cursor;
    total = std::max(total, b.offset + b.size);
    auto pos = std::upper_bound(placed.begin(), placed.end(), b.offset,
                                [&](size_t off, size_t j) { return off < blocks[j].offset; });
    placed.insert(pos, i);
  }
  return total;
}

// Largest sum of block sizes live at one step (steps -1 .. n_steps).
size_t lower_bound(const std::vector<Block>& blocks, size_t n_steps) {
  std::vector<size_t> add(n_steps + 3, 0), sub(n_steps + 3, 0);
  for (const Block& b : blocks) {
    add[size_t(b.first + 1)] += b.size;
    sub[size_t(b.last + 1)] += b.size;  // still live at `last`, gone after it
  }
  size_t live = 0, peak = 0;
  for (size_t s = 0; s < add.size(); ++s) {
    live += add[s];
    peak = std::max(peak, live);
    live -= sub[s];
  }
  return peak;
}

}  // namespace

void place_blocks(Plan& plan, size_t alignment, Placement how) {
  std::vector<Block>& blocks = plan.blocks;
  MemoryPlan& st = plan.stats;
  st.lower_bound = lower_bound(blocks, st.n_steps);
  st.buffer_size = place_best_fit(blocks, plan.events, std::max<size_t>(alignment, 1));
  st.strategy = "best-fit";
  st.best_fit_size = st.buffer_size;
  if (how == Placement::best_fit) return;
  if (how == Placement::best &&
      (st.buffer_size == st.lower_bound || blocks.size() > kMaxBlocksOffline))
    return;
  // Offline orders: largest first (big blocks fixed early, small ones fill the
  // gaps); latest end first (blocks that outlive others sit below them, so the
  // space of short-lived ones is one contiguous region when it frees); earliest
  // start first (the walk's own order, without best-fit's blindness to the future).
  auto by_size = [&](size_t a, size_t b) {
    if (blocks[a].size != blocks[b].size) return blocks[a].size > blocks[b].size;
    return blocks[a].first < blocks[b].first;
  };
  auto by_end = [&](size_t a, size_t b) {
    if (blocks[a].last != blocks[b].last) return blocks[a].last > blocks[b].last;
    return blocks[a].size > blocks[b].size;
  };
  auto by_start = [&](size_t a, size_t b) {
    if (blocks[a].first != blocks[b].first) return blocks[a].first < blocks[b].first;
    return blocks[a].size > blocks[b].size;
  };
  struct Order {
    Placement which;
    const char* name;
    std::function<bool(size_t, size_t)> less;
  };
  const Order orders[] = {{Placement::by_size, "by-size", by_size},
                          {Placement::by_end, "by-end", by_end},
                          {Placement::by_start, "by-start", by_start}};
  const bool forced = how != Placement::best;
  for (const Order& o : orders) {
    if (forced && o.which != how) continue;
    std::vector<size_t> order(blocks.size());
    std::iota(order.begin(), order.end(), size_t(0));
    std::stable_sort(order.begin(), order.end(), o.less);
    std::vector<Block> alt = blocks;
    const size_t size = place_ordered(alt, order);
    if (forced || size < st.buffer_size) {
      blocks = std::move(alt);
      st.buffer_size = size;
      st.strategy = o.name;
    }
    if (st.buffer_size == st.lower_bound) break;
  }
}

}  // namespace kiln::alloc_detail
