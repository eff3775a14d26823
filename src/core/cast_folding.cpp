// Graph::fold_bf16_casts: a bf16 cast read only by matmuls is dropped, and
// the matmuls read its f32 source rounded to bf16 as they pack it
// (MatmulParams::round_bf16): the same product, bit for bit, without a pass
// that writes the bf16 copy and another that reads it. The casts of weights
// (every forward) and of the output gradients of Linears (every backward) are
// of this kind under the bf16 policy.
#include <algorithm>
#include <functional>
#include <unordered_map>
#include <unordered_set>

#include "core/graph_rewrite.h"
#include "kiln/context.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/graph.h"

namespace kiln {
namespace {

using detail::kRewritePinned;

// The source must be laid out as the cast is (contiguous): the matmuls then
// read it with the cast's strides, and the CPU GEMM, which picks its path (and
// so its order of sums) by the operands' layout, takes the same path. A cast
// of a strided view is a dense copy whose fold could change the path.
bool is_bf16_cast(const TensorNode* n) {
  return n->op == Op::COPY && n->dtype == DType::bf16 && n->n_src == 1 && n->src[0] &&
         n->src[0]->dtype == DType::f32 && n->src[0]->is_contiguous() && !n->is_view() &&
         n->is_contiguous() && !(n->flags & kRewritePinned);
}

// Which factor of matmul m (0 left, 1 right) src slot k is; -1 if not a factor.
int factor_of(const TensorNode* m, int k) {
  if (m->op == Op::MATMUL) return k <= 1 ? k : -1;
  if (m->op == Op::MATMUL_ACC) return k == 1 || k == 2 ? k - 1 : -1;
  return -1;
}

// The memory owner of x (x itself unless a view).
const TensorNode* owner(const TensorNode* x) { return x->view_src ? x->view_src : x; }

// Tensor(s) permuted as view v permutes its source.
Tensor permuted_like(const TensorNode* v, Tensor s) {
  const auto& ax = op_params<Op::PERMUTE>(*v).axes;
  switch (s.ndim()) {
    case 2: return s.permute({int(ax[0]), int(ax[1])});
    case 3: return s.permute({int(ax[0]), int(ax[1]), int(ax[2])});
    case 4: return s.permute({int(ax[0]), int(ax[1]), int(ax[2]), int(ax[3])});
    default: return {};
  }
}

}  // namespace

size_t Graph::fold_bf16_casts() {
  check_alive();
  if (nodes_.empty()) return 0;
  // Readers of every node anywhere in the context, not only in this graph.
  Context* ctx = nodes_[0]->ctx;
  std::unordered_map<const TensorNode*, std::vector<const TensorNode*>> readers;
  for (size_t i = 0; i < ctx->size(); ++i) {
    const TensorNode* c = ctx->node(i);
    for (int k = 0; k < c->n_src; ++k)
      if (c->src[k]) readers[c->src[k]].push_back(c);
    if (c->view_src && !(c->n_src > 0 && c->src[0] == c->view_src))
      readers[c->view_src].push_back(c);
  }
  std::unordered_map<const TensorNode*, size_t> index;
  for (size_t i = 0; i < nodes_.size(); ++i) index[nodes_[i]] = i;
  const auto grad_nodes = detail::grad_node_set(grads_);
  // Dead: outside this graph, not pinned, and nothing live reads it (e.g. the
  // product that autodiff turned into a MATMUL_ACC, though it is recorded as
  // the weight's gradient): it never runs here, so it does not count.
  std::unordered_map<const TensorNode*, bool> dead_memo;
  std::function<bool(const TensorNode*)> dead = [&](const TensorNode* x) {
    if (auto it = dead_memo.find(x); it != dead_memo.end()) return it->second;
    bool d = !index.count(x) && !(x->flags & kRewritePinned);
    for (const TensorNode* r : readers[x]) d = d && dead(r);
    return dead_memo[x] = d;
  };

  // One cast's fold: the permuted views of it (parents first) and the matmul
  // factors that read the cast or those views.
  struct Fold {
    TensorNode* cast;
    std::vector<TensorNode*> views;
    std::vector<std::pair<TensorNode*, const TensorNode*>> reads;  // (matmul, what it reads)
    size_t last = 0;                                               // index of the last matmul
  };
  // Collects x's live readers into f; false if one is neither a matmul
  // factor nor a permuted view read that way.
  std::function<bool(const TensorNode*, Fold&)> collect = [&](const TensorNode* x, Fold& f) {
    for (const TensorNode* r : readers[x]) {
      if (dead(r)) continue;
      bool reads_x = false;  // else a view of a view of x: reached through its src
      for (int k = 0; k < r->n_src; ++k) reads_x = reads_x || r->src[k] == x;
      if (!reads_x) continue;
      if (!index.count(r)) return false;
      TensorNode* m = const_cast<TensorNode*>(r);
      // (A matmul's result is unchanged, whatever it is; a view of the cast
      // that is itself a gradient or pinned stays.)
      if (r->op == Op::MATMUL || r->op == Op::MATMUL_ACC) {
        for (int k = 0; k < r->n_src; ++k)
          if (r->src[k] == x && factor_of(r, k) < 0) return false;
        f.reads.emplace_back(m, x);
        f.last = std::max(f.last, index[r]);
      } else if (r->op == Op::PERMUTE && r->src[0] == x && r->shape.ndim() >= 2 &&
                 r->shape.ndim() <= 4 && !grad_nodes.count(r) && !(r->flags & kRewritePinned)) {
        f.views.push_back(m);
        if (!collect(r, f)) return false;
      } else {
        return false;
      }
    }
    return true;
  };

  std::vector<Fold> folds;
  for (TensorNode* c : nodes_) {
    if (!is_bf16_cast(c) || grad_nodes.count(c)) continue;
    Fold f{c, {}, {}, index[c]};
    if (!collect(c, f) || f.reads.empty()) continue;
    // Memory: the matmuls now keep the f32 source alive instead of the cast.
    // In the forward pass fold only when it is alive that long anyway (a
    // param, an input, or read again at or after the last of them): else a
    // saved activation would stay f32 until the backward. In the backward pass
    // always: there a cast is a Linear's output gradient, read by its two
    // products within a few nodes, so the f32 gradient lives a few nodes longer
    // and the bf16 copy, half its size, is never allocated.
    const TensorNode* s = c->src[0];
    const TensorNode* o = owner(s);
    bool alive = (o->flags & kRewritePinned) || o->op == Op::NONE || index[c] >= n_forward_;
    for (const TensorNode* x : {o, s})
      for (const TensorNode* r : readers[x])
        alive = alive || (r != c && index.count(r) && index[r] >= f.last);
    if (alive) folds.push_back(std::move(f));
  }
  if (folds.empty()) return 0;

  std::unordered_set<const TensorNode*> gone;
  std::unordered_map<const TensorNode*, std::vector<TensorNode*>> replacement;  // cast -> views
  for (Fold& f : folds) {
    std::unordered_map<const TensorNode*, TensorNode*> now;  // cast or view -> its f32 stand-in
    now[f.cast] = f.cast->src[0];
    gone.insert(f.cast);
    std::vector<TensorNode*>& made = replacement[f.cast];
    for (TensorNode* v : f.views) {
      TensorNode* sv = permuted_like(v, Tensor(now.at(v->src[0]))).node();
      now[v] = sv;
      made.push_back(sv);
      seen_.insert(sv);
      gone.insert(v);
    }
    for (auto& [m, x] : f.reads) {
      MatmulParams p = op_params<MatmulParams>(*m);
      for (int k = 0; k < m->n_src; ++k)
        if (m->src[k] == x) {
          m->src[size_t(k)] = now.at(x);
          p.round_bf16 |= uint8_t(1u << factor_of(m, k));
        }
      detail::set_params(*m, p);
    }
  }
  // The new views take the cast's place (its source is computed before it).
  detail::rewrite_node_list(nodes_, n_forward_, seen_, gone, replacement);
  return folds.size();
}

}  // namespace kiln
