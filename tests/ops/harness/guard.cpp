#include "ops/harness/guard.h"

#include <algorithm>
#include <cstring>
#include <span>
#include "kiln/ext/tensor_node.h"

namespace kiln::test {

namespace {

// A byte pattern that depends on the position, so a kernel storing a constant (or
// copying a neighbouring guard) does not happen to write the expected bytes.
unsigned char pattern(size_t offset) {
  uint32_t h = uint32_t(offset) * 2654435761u;
  return static_cast<unsigned char>((h >> 24) ^ 0xA5u);
}

// The memory a tensor's bytes live in: itself, or the tensor it views.
const TensorNode* owner(const TensorNode* n) { return n->view_src ? n->view_src : n; }

}  // namespace

std::string node_str(const TensorNode* n) {
  std::string s = "node #" + std::to_string(n->id) + " " + op_name(n->op) + " " + n->shape.str();
  if (!n->name.empty()) s += " '" + n->name + "'";
  return s;
}

std::unique_ptr<Buffer> GuardedMemory::allocate(Context& ctx, Backend& be) {
  BufferType& bt = be.buffer_type();
  KILN_ASSERT(bt.is_host());
  const size_t align = std::max<size_t>(bt.alignment(), 1);
  auto round_up = [align](size_t x) { return (x + align - 1) / align * align; };
  const size_t guard = round_up(kGuardBytes);

  std::vector<std::pair<TensorNode*, size_t>> blocks;  // tensor, offset
  size_t total = guard;
  for (size_t i = 0; i < ctx.size(); ++i) {
    TensorNode* n = ctx.node(i);
    if (n->data || n->view_src) continue;
    blocks.emplace_back(n, total);
    total += round_up(bt.alloc_size(n)) + guard;
  }
  std::unique_ptr<Buffer> buf = bt.alloc(total);
  auto* base = static_cast<unsigned char*>(buf->base());
  base_ = base;
  regions_.clear();
  // Everything is guard except each tensor's exact bytes: the rounding slack
  // after a tensor belongs to the guard, so one element past the end is caught.
  for (size_t k = 0; k < total; ++k) base[k] = pattern(k);
  size_t prev_end = 0;
  const TensorNode* prev = nullptr;
  for (auto& [n, off] : blocks) {
    n->data = base + off;
    n->buffer = buf.get();
    buf->track(n);  // detached when the buffer dies, like allocate_tensors' tensors
    std::memset(base + off, 0, n->nbytes());
    regions_.push_back({prev_end, off, prev, n});
    prev_end = off + n->nbytes();
    prev = n;
  }
  regions_.push_back({prev_end, total, prev, nullptr});
  for (size_t i = 0; i < ctx.size(); ++i) {
    TensorNode* n = ctx.node(i);
    if (n->view_src && !n->data && n->view_src->data) {
      n->data = static_cast<char*>(n->view_src->data) + n->view_offs;
      n->buffer = n->view_src->buffer;
    }
  }
  return buf;
}

std::string GuardedMemory::check() const {
  for (const Region& r : regions_) {
    for (size_t k = r.begin; k < r.end; ++k) {
      if (base_[k] == pattern(k)) continue;
      // Name the nearer tensor: a write just past one tensor's end, or just
      // before the next one's start.
      const size_t past_end = k - r.begin, before_start = r.end - k;
      if (r.before && (past_end < before_start || !r.after))
        return "guard bytes overwritten " + std::to_string(past_end) + " bytes past the end of " +
               node_str(r.before) + " (" + std::to_string(r.before->nbytes()) + " bytes)";
      if (r.after)
        return "guard bytes overwritten " + std::to_string(before_start) +
               " bytes before the start of " + node_str(r.after);
      return "guard bytes overwritten at buffer offset " + std::to_string(k);
    }
  }
  return {};
}

std::string run_checked(const Graph& g, Backend& be, const GuardedMemory& mem) {
  for (TensorNode* n : g.nodes()) {
    // Snapshot the memory of each source (whole blocks: a view's source may be
    // read through any layout).
    std::vector<std::pair<const TensorNode*, std::vector<unsigned char>>> before;
    const bool may_write_srcs = op_kind(n->op) == OpKind::ALIAS;
    if (!may_write_srcs) {
      for (int i = 0; i < n->n_src; ++i) {
        const TensorNode* o = n->src[i] ? owner(n->src[i]) : nullptr;
        if (!o || !o->data || o == owner(n)) continue;
        if (std::any_of(before.begin(), before.end(), [o](const auto& b) { return b.first == o; }))
          continue;
        const auto* p = static_cast<const unsigned char*>(o->data);
        before.emplace_back(o, std::vector<unsigned char>(p, p + o->nbytes()));
      }
    }
    TensorNode* one[1] = {n};
    be.compute(std::span<TensorNode* const>(one, 1));
    be.synchronize();
    std::string e = mem.check();
    if (!e.empty()) return "after " + node_str(n) + ": " + e;
    for (const auto& [o, bytes] : before) {
      const auto* p = static_cast<const unsigned char*>(o->data);
      const auto diff = std::mismatch(bytes.begin(), bytes.end(), p);
      if (diff.first != bytes.end())
        return node_str(n) + " changed its source " + node_str(o) + " at byte " +
               std::to_string(diff.first - bytes.begin()) + " (only ALIAS ops may update a source)";
    }
  }
  return {};
}

}  // namespace kiln::test
