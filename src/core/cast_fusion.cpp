// Graph::fuse_bf16_casts: folds a bf16 cast into the op that produces its
// source, so the op's kernel rounds on store instead of a second pass over
// memory (and a second thread-pool dispatch) doing it.
#include <unordered_map>

#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

// Ops whose CPU kernels store a bf16 dst (rounding as a COPY does).
bool stores_bf16(Op op) {
  switch (op) {
    case Op::LAYER_NORM:
    case Op::GELU:
    case Op::GELU_ERF:
    case Op::GELU_BACK:
    case Op::GELU_ERF_BACK: return true;
    default: return false;
  }
}

constexpr uint32_t kPinned =
    kFlagInput | kFlagOutput | kFlagParam | kFlagLoss | kFlagGradAcc | kFlagCheckpoint;

// The cast's source when the cast may take over its op, else null.
TensorNode* fusable_source(const TensorNode* n) {
  if (n->op != Op::COPY || n->dtype != DType::bf16 || n->n_src != 1 || n->is_view() ||
      !n->is_contiguous())
    return nullptr;
  TensorNode* s = n->src[0];
  if (!s || s->dtype != DType::f32 || s->shape != n->shape || s->is_view() || !s->is_contiguous() ||
      (s->flags & kPinned) || !stores_bf16(s->op) || s->ctx != n->ctx)
    return nullptr;
  return s;
}

}  // namespace

size_t Graph::fuse_bf16_casts() {
  check_alive();
  std::unordered_map<const TensorNode*, int> readers;  // candidate source -> readers
  Context* ctx = nullptr;
  for (TensorNode* n : nodes_)
    if (const TensorNode* s = fusable_source(n); s && seen_.count(s)) {
      readers[s] = 0;
      ctx = s->ctx;
    }
  if (readers.empty() || !ctx) return 0;
  // Readers anywhere in the context (other graphs built from the same nodes, the
  // partial-batch tail, recomputed segments), not only in this graph.
  auto count = [&](const TensorNode* s) {
    if (!s) return;
    auto it = readers.find(s);
    if (it != readers.end()) ++it->second;
  };
  for (size_t i = 0; i < ctx->size(); ++i) {
    const TensorNode* c = ctx->node(i);
    for (int k = 0; k < c->n_src; ++k) count(c->src[k]);
    count(c->view_src);
  }

  std::unordered_map<const TensorNode*, TensorNode*> gone;  // source -> its fused cast
  for (TensorNode* n : nodes_) {
    TensorNode* s = fusable_source(n);
    if (!s) continue;
    auto it = readers.find(s);
    if (it == readers.end() || it->second != 1) continue;
    n->op = s->op;
    n->params = s->params;
    n->src = s->src;
    n->n_src = s->n_src;
    gone[s] = n;
  }
  if (gone.empty()) return 0;
  // Graph::grad of an intermediate whose gradient was fused: its bf16 rounding.
  for (auto& [t, g] : grads_)
    if (auto it = gone.find(g); it != gone.end()) g = it->second;
  size_t removed_forward = 0;
  for (size_t i = 0; i < n_forward_; ++i) removed_forward += gone.count(nodes_[i]);
  std::erase_if(nodes_, [&](const TensorNode* n) { return gone.count(n) > 0; });
  n_forward_ -= removed_forward;
  for (const auto& [s, n] : gone) seen_.erase(s);
  return gone.size();
}

}  // namespace kiln
