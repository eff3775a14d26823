// Graph::fuse_matmul_bias: folds a Linear's bias add into its matmul, so the
// CPU GEMM adds the bias row to each C tile as it finishes it instead of a
// second pass over memory (and a second thread-pool dispatch) doing it.
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

using detail::kRewritePinned;

// n = ADD(s, bias) or ADD(bias, s): s a plain 2-D product [M, N] of 2-D float
// operands, bias f32 [N] or [1, N] with contiguous elements.
struct BiasCandidate {
  TensorNode* n = nullptr;
  TensorNode* s = nullptr;
  TensorNode* bias = nullptr;
};

bool is_product(const TensorNode* s, const TensorNode* n) {
  if (s->op != Op::MATMUL || s->n_src != 2 || s->is_view() || s->dtype != DType::f32 ||
      s->shape != n->shape || (s->flags & kRewritePinned) || s->ctx != n->ctx)
    return false;
  for (int k = 0; k < 2; ++k) {
    const TensorNode* o = s->src[k];
    if (!o || o->shape.ndim() != 2 ||
        (o->dtype != DType::f32 && o->dtype != DType::f16 && o->dtype != DType::bf16))
      return false;  // (quantized weights take another kernel path)
  }
  return true;
}

bool is_bias_row(const TensorNode* b, int64_t N) {
  const Shape& sh = b->shape;
  const bool row = (sh.ndim() == 1 && sh[0] == N) || (sh.ndim() == 2 && sh[0] == 1 && sh[1] == N);
  return row && b->dtype == DType::f32 && b->is_contiguous();
}

bool bias_candidate_of(TensorNode* n, BiasCandidate& c) {
  if (n->op != Op::ADD || n->n_src != 2 || n->is_view() || n->dtype != DType::f32 ||
      n->shape.ndim() != 2 || !n->is_contiguous() || !n->src[0] || !n->src[1])
    return false;
  for (int k = 0; k < 2; ++k) {
    TensorNode *s = n->src[k], *b = n->src[1 - k];
    if (s != b && is_product(s, n) && is_bias_row(b, n->shape[1])) {
      c = {n, s, b};
      return true;
    }
  }
  return false;
}

}  // namespace

size_t Graph::fuse_matmul_bias() {
  check_alive();
  std::vector<BiasCandidate> cands;
  std::unordered_map<const TensorNode*, int> readers;  // of each product s
  for (TensorNode* n : nodes_) {
    BiasCandidate c;
    if (!bias_candidate_of(n, c) || !seen_.count(c.s)) continue;
    cands.push_back(c);
    readers[c.s] = 0;
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].s->ctx, readers);
  const auto grad_nodes = detail::grad_node_set(grads_);  // Graph::grad must keep finding them

  std::unordered_set<const TensorNode*> gone;
  for (const BiasCandidate& c : cands) {
    if (readers[c.s] != 1 || grad_nodes.count(c.s)) continue;
    // The ADD node becomes the product with the bias as its third source; its
    // consumers, flags and memory stay as they were.
    TensorNode* n = c.n;
    n->op = Op::MATMUL;
    n->params = c.s->params;
    n->n_src = 3;
    n->src = {};
    n->src[0] = c.s->src[0];
    n->src[1] = c.s->src[1];
    n->src[2] = c.bias;
    gone.insert(c.s);
  }
  if (gone.empty()) return 0;
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone);
  return gone.size();
}

}  // namespace kiln
