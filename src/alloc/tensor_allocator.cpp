// TensorAllocator: best fit over a free list sorted by offset. The list is a
// plain vector: graphs keep only a few dozen free blocks at a time, so a linear
// scan beats any tree here and keeps the behaviour easy to reason about.
#include <algorithm>

#include "kiln/ext/alloc.h"

namespace kiln {

namespace {

std::string describe(const TensorNode* t) {
  if (!t) return "block";
  return "tensor " + t->label() + " " + t->shape.str();
}

}  // namespace

TensorAllocator::TensorAllocator(BufferType& type)
    : type_(&type), align_(type.alignment()), capacity_(SIZE_MAX) {
  reset();
}

TensorAllocator::TensorAllocator(Buffer& buffer)
    : type_(&buffer.type()),
      buffer_(&buffer),
      align_(buffer.type().alignment()),
      capacity_(buffer.size()) {
  reset();
}

TensorAllocator::TensorAllocator(size_t alignment, size_t capacity)
    : align_(alignment ? alignment : 1), capacity_(capacity) {
  reset();
}

void TensorAllocator::reset() {
  free_.clear();
  // Measure mode: one free block that never runs out. Capped well below SIZE_MAX
  // so offset + size never overflows.
  const size_t cap = capacity_ == SIZE_MAX ? SIZE_MAX / 4 : capacity_ / align_ * align_;
  if (cap > 0) free_.push_back({0, cap});
  high_water_ = 0;
  in_use_ = 0;
}

size_t TensorAllocator::block_size(const TensorNode* t) const {
  const size_t n = type_ ? type_->alloc_size(t) : t->nbytes();
  return round_up(std::max<size_t>(n, 1));
}

size_t TensorAllocator::largest_free() const {
  size_t m = 0;
  for (const Block& b : free_) m = std::max(m, b.size);
  return m;
}

size_t TensorAllocator::alloc(const TensorNode* t) { return alloc_impl(block_size(t), t); }

size_t TensorAllocator::alloc(size_t bytes) {
  return alloc_impl(round_up(std::max<size_t>(bytes, 1)), nullptr);
}

size_t TensorAllocator::alloc_impl(size_t bytes, const TensorNode* t) {
  // Best fit: the smallest block that holds `bytes`; the lowest offset on ties.
  size_t best = free_.size();
  for (size_t i = 0; i < free_.size(); ++i)
    if (free_[i].size >= bytes && (best == free_.size() || free_[i].size < free_[best].size))
      best = i;
  if (best == free_.size())
    fail("alloc", describe(t), " needs ", bytes, " bytes but the largest free block is ",
         largest_free(), " bytes");
  Block& b = free_[best];
  const size_t offset = b.offset;
  b.offset += bytes;
  b.size -= bytes;
  if (b.size == 0) free_.erase(free_.begin() + std::ptrdiff_t(best));
  high_water_ = std::max(high_water_, offset + bytes);
  in_use_ += bytes;
  return offset;
}

void TensorAllocator::free(size_t offset, size_t bytes) {
  bytes = round_up(std::max<size_t>(bytes, 1));
  KILN_ASSERT(offset % align_ == 0 && offset + bytes <= high_water_ && bytes <= in_use_);
  // First free block after the freed range; the range must not overlap its neighbours.
  auto next = std::lower_bound(free_.begin(), free_.end(), offset,
                               [](const Block& b, size_t off) { return b.offset < off; });
  KILN_ASSERT(next == free_.end() || offset + bytes <= next->offset);
  const bool merge_next = next != free_.end() && next->offset == offset + bytes;
  const bool has_prev = next != free_.begin();
  if (has_prev) KILN_ASSERT(std::prev(next)->offset + std::prev(next)->size <= offset);
  const bool merge_prev = has_prev && std::prev(next)->offset + std::prev(next)->size == offset;
  in_use_ -= bytes;
  if (merge_prev && merge_next) {
    auto prev = std::prev(next);
    prev->size += bytes + next->size;
    free_.erase(next);
  } else if (merge_prev) {
    std::prev(next)->size += bytes;
  } else if (merge_next) {
    next->offset = offset;
    next->size += bytes;
  } else {
    free_.insert(next, Block{offset, bytes});
  }
}

size_t TensorAllocator::place(TensorNode* t) {
  if (!buffer_) fail("alloc", "cannot place ", describe(t), ": this allocator only measures");
  const size_t offset = alloc(t);
  t->data = static_cast<char*>(buffer_->base()) + offset;
  t->buffer = buffer_;
  buffer_->track(t);
  return offset;
}

void TensorAllocator::release(TensorNode* t) {
  KILN_ASSERT(buffer_ && t->buffer == buffer_ && t->data);
  free(t, size_t(static_cast<char*>(t->data) - static_cast<char*>(buffer_->base())));
  t->data = nullptr;
  t->buffer = nullptr;
}

}  // namespace kiln
