// Memory planning (docs/design.md, principle 4): the tensor allocator places blocks
// inside one buffer; the graph allocator walks a graph in execution order, frees
// a tensor's block after its last consumer ran, reuses blocks (also in place)
// and sizes one buffer exactly with a measure pass.
//
//   kiln::GraphAllocator galloc(cpu.buffer_type());
//   galloc.reserve(worst_case_graph);   // optional: size the buffer once
//   galloc.alloc(graph);                // every tensor of `graph` gets memory
//   x.set(...); cpu.compute(graph);
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"
#include "kiln/memory_plan.h"
#include "kiln/tensor.h"

namespace kiln {

// ---------------------------------------------------------------------------
// TensorAllocator: blocks inside one buffer (offsets from the buffer's start).
// Best fit over a free list sorted by offset; neighbours merge on free. In
// measure mode there is no buffer and the space is unbounded: high_water() is
// then the buffer size the same sequence of allocations would need.
class TensorAllocator {
 public:
  // Measure mode: alignment and alloc_size from `type`, no memory.
  explicit TensorAllocator(BufferType& type);
  // Places tensors inside `buffer` (which must outlive the allocator).
  explicit TensorAllocator(Buffer& buffer);
  // Offsets only, for planners: a space of `capacity` bytes (SIZE_MAX: unbounded).
  TensorAllocator(size_t alignment, size_t capacity);

  bool measuring() const { return buffer_ == nullptr; }
  size_t alignment() const { return align_; }
  size_t capacity() const { return capacity_; }
  // Bytes t's block takes: the buffer type's alloc_size, rounded up to the alignment
  // (at least one alignment unit, so every tensor has a distinct address).
  size_t block_size(const TensorNode* t) const;

  // A block for t; returns its offset. Throws kiln::Error "[alloc] tensor 'name'
  // [shape] needs N bytes but the largest free block is M bytes" when it does not fit.
  size_t alloc(const TensorNode* t);
  size_t alloc(size_t bytes);  // same, for a raw byte count (rounded up)
  void free(size_t offset, size_t bytes);
  void free(const TensorNode* t, size_t offset) { free(offset, block_size(t)); }

  // alloc + point t->data/t->buffer at the block (not in measure mode).
  size_t place(TensorNode* t);
  // Frees the block t was placed in and clears t->data/t->buffer.
  void release(TensorNode* t);

  size_t high_water() const { return high_water_; }  // end of the highest block ever used
  size_t in_use() const { return in_use_; }          // bytes in live blocks
  size_t largest_free() const;
  size_t n_free_blocks() const { return free_.size(); }
  void reset();  // everything free; the high-water mark starts again at 0

 private:
  struct Block {
    size_t offset, size;
  };
  size_t alloc_impl(size_t bytes, const TensorNode* t);
  size_t round_up(size_t n) const { return (n + align_ - 1) / align_ * align_; }

  BufferType* type_ = nullptr;
  Buffer* buffer_ = nullptr;
  size_t align_ = 1;
  size_t capacity_ = 0;
  std::vector<Block> free_;  // sorted by offset, never adjacent (merged)
  size_t high_water_ = 0;
  size_t in_use_ = 0;
};

// ---------------------------------------------------------------------------
// What a graph allocator plans: nodes in execution order plus the leaves they
// read. Graph converts to it; the scheduler builds one per backend and passes
// the whole schedule with `mine` selecting that backend's tensors (consumers on
// other backends still count, so nothing is freed early).
struct NodeList {
  std::span<TensorNode* const> nodes;  // execution order (views and computed nodes)
  std::span<TensorNode* const> leafs;  // more leaves are found from the nodes' sources
  // Which tensors this allocator places (null: all). Others are external: never
  // allocated or freed here; their memory comes from elsewhere.
  std::function<bool(const TensorNode*)> mine;
  // Extra tensors to keep alive to the end (e.g. read by a later split). Null: none.
  std::function<bool(const TensorNode*)> keep;

  NodeList() = default;
  NodeList(const Graph& g) : nodes(g.nodes()), leafs(g.leafs()) {}  // NOLINT: implicit on purpose
  NodeList(std::span<TensorNode* const> n, std::span<TensorNode* const> l = {})
      : nodes(n), leafs(l) {}
};

// How blocks get their offsets (see src/alloc/placement.cpp). `best` tries all and
// keeps the smallest buffer; the others force one strategy (tests, comparisons).
enum class Placement { best, best_fit, by_size, by_end, by_start };

struct GraphAllocatorOptions {
  // false: every tensor gets its own block for the whole graph (no freeing, no
  // in-place). For tests ("same results with reuse on and off") and debugging.
  bool reuse = true;
  // In-place reuse of src0's block by ops marked inplace in ops.def.
  bool inplace = true;
  Placement placement = Placement::best;
};

// Plans and allocates the tensors of graphs in one buffer of a buffer type.
//
// Liveness: leaves, tensors flagged kFlagInput/kFlagOutput/kFlagParam/kFlagLoss/
// kFlagGradAcc (or having such a view) and tensors selected by NodeList::keep live
// to the end. Every other tensor lives from its node's step to the step of its
// last consumer; a view's consumers count as consumers of the tensor it views.
// Tensors that already have memory outside this allocator's buffer are
// pre-allocated and left alone. Views get data = source data + view_offs.
//
// In place: a node whose op is marked inplace in ops.def takes over the block of
// its src0's memory when this node is the last reader of that memory (no other
// pending consumer, no other source of the node aliasing it, no live view), src0
// and the node are contiguous with the same dtype and size and src0 starts at the
// block's start, and neither is kept alive as above or pre-allocated.
//
// alloc() re-places every tensor without memory or in this allocator's buffer;
// placement is deterministic, so allocating the same graph again keeps every
// tensor (and the values of leaves and accumulators) where it was. When the
// buffer must grow, the old buffer is freed: tensors of other graphs that lived
// there lose their memory (reserve() the largest graph first to avoid that).
// A fresh buffer is zero-filled, so leaves (gradient accumulators too) start at 0.
class GraphAllocator {
 public:
  explicit GraphAllocator(BufferType& type, GraphAllocatorOptions opt = {});
  ~GraphAllocator();
  GraphAllocator(const GraphAllocator&) = delete;
  GraphAllocator& operator=(const GraphAllocator&) = delete;

  // Plans without touching memory or tensors.
  MemoryPlan measure(const NodeList& list) const;
  // Sizes the buffer for `list` (grows it if needed, never shrinks); sets no data.
  // Returns true when it (re)allocated the buffer.
  bool reserve(const NodeList& list);
  // Plans `list` and points every tensor at its place. Returns true when the buffer
  // had to be (re)allocated because the plan did not fit (first call included).
  bool alloc(const NodeList& list);

  const MemoryPlan& plan() const { return plan_; }  // of the last alloc/reserve
  Buffer* buffer() const { return buffer_.get(); }
  size_t buffer_size() const;
  int n_reallocs() const { return n_reallocs_; }  // buffers allocated so far
  BufferType& buffer_type() const { return type_; }
  const GraphAllocatorOptions& options() const { return opt_; }

 private:
  bool grow(size_t size);
  BufferType& type_;
  GraphAllocatorOptions opt_;
  std::unique_ptr<Buffer> buffer_;
  MemoryPlan plan_;
  int n_reallocs_ = 0;
};

}  // namespace kiln
