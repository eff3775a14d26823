// Backend-independent helpers: running a Graph, copying tensors between
// buffers, and the simple "everything in one buffer" allocator.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {

size_t BufferType::alloc_size(const TensorNode* t) const { return t->nbytes(); }

void Backend::compute(const Graph& g) {
  for (const TensorNode* l : g.leafs())
    if (!l->data)
      fail("compute", "leaf ", l->label(), " ", l->shape.str(),
           " has no memory: allocate it first");
  compute(std::span<TensorNode* const>(g.nodes()));
}

GraphPasses Backend::supported_passes(GraphPasses wanted) const {
  GraphPasses s = wanted;
  for (const GraphPassInfo& i : graph_pass_table())
    if (wanted.has(i.pass) && !supports_pass(i.pass)) s = s.without(i.pass);
  return s;
}

Buffer::~Buffer() {
  for (const User& u : users_) {
    if (u.life.expired()) continue;  // that context and its tensors are gone already
    for (size_t i = 0; i < u.ctx->size(); ++i) {
      TensorNode* n = u.ctx->node(i);
      if (n->buffer != this) continue;
      n->data = nullptr;
      n->buffer = nullptr;
    }
  }
}

void Buffer::track(const TensorNode* t) {
  if (!t->ctx) return;  // a node outside any context: its owner manages it
  for (const User& u : users_)
    if (u.ctx == t->ctx && !u.life.expired()) return;
  std::erase_if(users_, [](const User& u) { return u.life.expired(); });
  users_.push_back({t->ctx, t->ctx->life()});
}

void detail::check_memory(const TensorNode* n) {
  auto check = [n](const TensorNode* t, const char* role) {
    if (t->data || t->numel() == 0) return;
    fail("compute", "node ", n->label(), " (", op_name(n->op), " ", n->shape.str(), ")", role,
         t == n ? "" : " ", t == n ? std::string() : t->label(),
         " has no memory: allocate the graph first (or its buffer was "
         "destroyed)");
  };
  check(n, "");
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i]) check(n->src[i], ": its source");
}

void copy_tensor(const TensorNode* src, TensorNode* dst) {
  if (!(src->shape == dst->shape) || src->dtype != dst->dtype)
    fail("copy_tensor", "src is ", dtype_name(src->dtype), " ", src->shape.str(), " but dst is ",
         dtype_name(dst->dtype), " ", dst->shape.str());
  if (!src->data || !dst->data) fail("copy_tensor", "both tensors need memory");
  if (!src->is_contiguous() || !dst->is_contiguous())
    fail("copy_tensor", "both tensors must be contiguous");
  const size_t n = src->nbytes();
  if (dst->buffer->copy_from(src, dst)) return;
  if (src->buffer->is_host()) {
    dst->buffer->set(dst, src->data, 0, n);
  } else if (dst->buffer->is_host()) {
    src->buffer->get(src, dst->data, 0, n);
  } else {
    std::vector<char> tmp(n);
    src->buffer->get(src, tmp.data(), 0, n);
    dst->buffer->set(dst, tmp.data(), 0, n);
  }
}

std::unique_ptr<Buffer> allocate_tensors(Context& ctx, Backend& backend) {
  BufferType& bt = backend.buffer_type();
  const size_t align = bt.alignment();
  auto round_up = [align](size_t x) { return (x + align - 1) / align * align; };
  std::vector<std::pair<TensorNode*, size_t>> todo;  // tensor, offset
  size_t total = 0;
  for (size_t i = 0; i < ctx.size(); ++i) {
    TensorNode* n = ctx.node(i);
    if (n->data || n->view_src) continue;
    todo.emplace_back(n, total);
    const size_t need = bt.alloc_size(n);
    // At least one alignment unit: an empty tensor still gets a distinct, valid address.
    const size_t block = need == 0 ? align : round_up(need);
    if (need > SIZE_MAX - align || __builtin_add_overflow(total, block, &total))
      fail("allocate_tensors", "the tensors need more than ", SIZE_MAX, " bytes in all (tensor ",
           n->label(), " ", n->shape.str(), " needs ", need, " bytes)");
  }
  if (total > bt.max_size())
    fail("allocate_tensors", "needs ", total, " bytes but ", bt.name(), " buffers hold at most ",
         bt.max_size());
  std::unique_ptr<Buffer> buf = bt.alloc(total);
  buf->clear(0);
  char* base = static_cast<char*>(buf->base());
  for (auto& [n, off] : todo) {
    n->data = base + off;
    n->buffer = buf.get();
  }
  if (ctx.size()) buf->track(ctx.node(0));
  for (size_t i = 0; i < ctx.size(); ++i) {
    TensorNode* n = ctx.node(i);
    if (n->view_src && !n->data && n->view_src->data) {
      n->data = static_cast<char*>(n->view_src->data) + n->view_offs;
      n->buffer = n->view_src->buffer;
    }
  }
  return buf;
}

}  // namespace kiln
