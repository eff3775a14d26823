// Graph::bf16_gelu_inputs: under the bf16 policy a Linear whose output only
// GELU reads (forward, and its backward as the saved input) stores that
// output in bf16, as PyTorch's autocast does (a Linear's result is bf16 there
// and GELU runs on it). The pass puts a cast to bf16 between the product and
// the GELU nodes; fuse_bf16_casts (run next) folds it into the product. The
// f32 output, the largest activation of a transformer block, is then never
// written, and GELU and its backward read half the bytes.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"
#include "kiln/tensor.h"

namespace kiln {
namespace {

using detail::kRewritePinned;

bool gelu_op(Op op) { return op == Op::GELU || op == Op::GELU_ERF; }
bool gelu_back_op(Op op) { return op == Op::GELU_BACK || op == Op::GELU_ERF_BACK; }

// GELU's input x: a MATMUL result s of bf16 factors (a product under the bf16
// policy), directly or through the reshapes detail::reshape_owner follows,
// those in `views` (x first). Exactly the products whose cast
// fuse_bf16_casts can fold into them.
struct Input {
  TensorNode* x = nullptr;
  TensorNode* s = nullptr;
  std::vector<TensorNode*> views;
};

bool input_of(TensorNode* gelu, Input& in) {
  TensorNode* x = gelu->src[0];
  if (!x || x->dtype != DType::f32 || !x->is_contiguous() || (x->flags & kRewritePinned))
    return false;
  std::vector<TensorNode*> views;
  TensorNode* s = detail::reshape_owner(x, views);
  if (!s || s->op != Op::MATMUL || s->dtype != DType::f32 || !s->is_contiguous() ||
      (s->flags & kRewritePinned) || s->ctx != gelu->ctx || s->n_src < 2 ||
      s->src[0]->dtype != DType::bf16 || s->src[1]->dtype != DType::bf16)
    return false;
  // Through a reshape the GEMM writes its [M, N] product into another shape,
  // which needs 2-D factors (as fuse_bf16_casts requires).
  if (!views.empty() &&
      (s->shape.ndim() != 2 || s->src[0]->shape.ndim() != 2 || s->src[1]->shape.ndim() != 2))
    return false;
  in = {x, s, std::move(views)};
  return true;
}

}  // namespace

size_t Graph::bf16_gelu_inputs() {
  check_alive();
  std::vector<std::pair<TensorNode*, Input>> cands;    // (GELU node, its input)
  std::unordered_map<const TensorNode*, int> readers;  // in the context: s, views, x
  for (TensorNode* n : nodes_) {
    Input in;
    if (!gelu_op(n->op) || n->dtype != DType::f32 || !input_of(n, in) || !seen_.count(in.s))
      continue;
    readers[in.s] = 0;
    for (const TensorNode* v : in.views) readers[v] = 0;
    cands.emplace_back(n, std::move(in));
  }
  if (cands.empty()) return 0;
  detail::count_context_readers(*cands[0].first->ctx, readers);
  // x's readers in this graph: the GELU and GELU backward nodes that read it
  // as their input, and any other.
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> read_by;
  for (TensorNode* m : nodes_)
    for (int k = 0; k < m->n_src; ++k)
      if (m->src[k] && readers.count(m->src[k])) read_by[m->src[k]].push_back(m);

  size_t rewritten = 0;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> cast_before;
  std::unordered_set<const TensorNode*> done;  // inputs already given a cast
  for (auto& [gelu, in] : cands) {
    if (done.count(in.x)) continue;
    // s is read by its reader view (and, through view_src, by a view of that
    // view) or by the GELU nodes; each view but x by the view after it only.
    const int s_readers =
        in.views.empty() ? readers[in.s]
                         : 1 + int(std::count_if(in.views.begin(), in.views.end(),
                                                 [](auto* v) { return v->src[0] != v->view_src; }));
    if (readers[in.s] != s_readers) continue;
    bool ok = true;
    for (size_t i = 1; i < in.views.size(); ++i) ok &= readers[in.views[i]] == 1;
    // x: only GELU (as its input) and GELU's backward (as x), all in this graph.
    const std::vector<TensorNode*>& xr = read_by[in.x];
    ok &= int(xr.size()) == readers[in.x];
    std::vector<std::pair<TensorNode*, int>> edges;  // (reader, source slot)
    for (TensorNode* m : xr) {
      if (gelu_op(m->op) && m->n_src == 1 && m->src[0] == in.x) edges.emplace_back(m, 0);
      else if (gelu_back_op(m->op) && m->n_src == 2 && m->src[1] == in.x && m->src[0] != in.x)
        edges.emplace_back(m, 1);
      else ok = false;
    }
    if (!ok) continue;
    TensorNode* cast = Tensor(in.x).to(bf16).node();
    seen_.insert(cast);
    for (auto& [m, k] : edges) m->src[size_t(k)] = cast;
    // Candidates come in node order, so `gelu` is the first node reading x.
    cast_before[gelu].push_back(cast);
    done.insert(in.x);
    ++rewritten;
  }
  if (rewritten == 0) return 0;
  detail::rewrite_node_list(nodes_, n_forward_, seen_, {}, cast_before);
  return rewritten;
}

}  // namespace kiln
