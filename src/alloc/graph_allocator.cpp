// GraphAllocator: plan (graph_plan.cpp, placement.cpp), size the buffer, point
// the tensors at their blocks.
#include "alloc/graph_plan.h"
#include "kiln/ext/alloc.h"

namespace kiln {

using alloc_detail::owner_of;
using alloc_detail::Plan;

namespace {

Plan make_plan(const NodeList& list, const BufferType& type, const Buffer* own,
               const GraphAllocatorOptions& opt) {
  Plan plan = alloc_detail::plan_liveness(list, type, own, opt);
  alloc_detail::place_blocks(plan, type.alignment(), opt.placement);
  return plan;
}

}  // namespace

GraphAllocator::GraphAllocator(BufferType& type, GraphAllocatorOptions opt)
    : type_(type), opt_(opt) {}

GraphAllocator::~GraphAllocator() = default;

size_t GraphAllocator::buffer_size() const { return buffer_ ? buffer_->size() : 0; }

MemoryPlan GraphAllocator::measure(const NodeList& list) const {
  return make_plan(list, type_, buffer_.get(), opt_).stats;
}

bool GraphAllocator::grow(size_t size) {
  if (buffer_ && buffer_->size() >= size) return false;
  if (size > type_.max_size())
    fail("alloc", "the graph needs a buffer of ", size, " bytes but ", type_.name(),
         " buffers hold at most ", type_.max_size(), " bytes");
  buffer_.reset();  // free the old memory before asking for more
  buffer_ = type_.alloc(size);
  // A fresh buffer starts zeroed so leaves (gradient accumulators in particular)
  // start from zero as with allocate_tensors().
  buffer_->clear(0);
  ++n_reallocs_;
  return true;
}

bool GraphAllocator::reserve(const NodeList& list) {
  plan_ = measure(list);
  return grow(plan_.buffer_size);
}

bool GraphAllocator::alloc(const NodeList& list) {
  // Plan against the current buffer (its tensors are ours to re-place) before any
  // reallocation replaces it.
  Plan plan = make_plan(list, type_, buffer_.get(), opt_);
  plan_ = plan.stats;
  const bool grew = grow(plan_.buffer_size);
  char* base = static_cast<char*>(buffer_->base());
  for (auto& [t, b] : plan.tensors) {
    t->data = base + plan.blocks[size_t(b)].offset;
    t->buffer = buffer_.get();
    buffer_->track(t);
  }
  for (TensorNode* v : plan.views) {
    const TensorNode* o = owner_of(v);
    if (!o->data) {
      if (list.mine) continue;  // another allocator places the owner
      fail("alloc", "view ", v->label(), " (", op_name(v->op), ") ", v->shape.str(),
           " aliases tensor ", o->label(), " which is not in the graph and has no memory");
    }
    v->data = static_cast<char*>(o->data) + v->view_offs;
    v->buffer = o->buffer;
  }
  return grew;
}

}  // namespace kiln
