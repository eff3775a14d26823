// Graph::backward: reverse-mode autodiff in O(nodes).
//  1. One forward pass marks nodes that depend on a param ("requires").
//  2. One reverse pass walks from the loss; each node with a gradient calls its
//     op's rule, which adds gradient nodes for the sources that require one.
//     With checkpoints, rules read recomputed copies of the forward tensors
//     between checkpoints (core/recompute.h).
// Gradients are ordinary graph nodes (flagged kFlagGrad) and never get
// gradients themselves; nothing is built for nodes off the param->loss paths.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/autodiff.h"
#include "core/recompute.h"
#include "kiln/ext/op_builder.h"
#include "kiln/graph.h"
#include "kiln/ops.h"

namespace kiln {

Tensor detail::GradCtx::out() const { return Tensor(re_ ? re_->of(node_) : node_); }
Tensor detail::GradCtx::src(int i) const {
  return Tensor(re_ ? re_->of(node_->src[i]) : node_->src[i]);
}

void detail::GradCtx::add(int i, Tensor g) {
  if (!needs_[i]) return;
  added_[i] = added_[i].defined() ? kiln::add(added_[i], g) : g;
}

namespace {

// The one dim a zero PAD pads (-1 when it pads several, none, or not with 0).
int padded_dim(const TensorNode* n) {
  if (n->op != Op::PAD) return -1;
  const PadParams p = op_params<Op::PAD>(*n);
  if (p.value != 0.0f) return -1;
  int dim = -1;
  for (int d = 0; d < n->shape.ndim(); ++d)
    if (p.before[size_t(d)] != 0 || p.after[size_t(d)] != 0) {
      if (dim >= 0) return -1;
      dim = d;
    }
  return dim;
}

// x and y, adjacent along d (x first, at start), as one view when both are
// views of one tensor laid out as a contiguous tensor of the padded shape
// `full`, at their places in it: the slices' gradients of ATTENTION_BACK when
// q, k and v are slices of one tensor (core/ops/attention.cpp). Their join is
// then that tensor's slice, no copy. Undefined otherwise.
Tensor joined_view(const Tensor& x, const Tensor& y, int d, int64_t start, const Shape& full) {
  const TensorNode *a = x.node(), *b = y.node();
  TensorNode* o = a->view_src;
  if (!o || b->view_src != o || o->dtype != a->dtype || o->shape != full) return {};
  const auto st = detail::contiguous_strides(full, a->dtype);
  if (!o->is_contiguous()) return {};
  for (int k = 0; k < full.ndim(); ++k)
    if (a->stride[size_t(k)] != st[size_t(k)] || b->stride[size_t(k)] != st[size_t(k)]) return {};
  const auto at = [&](int64_t pos) { return size_t(pos * st[size_t(d)]); };
  if (a->view_offs != at(start) || b->view_offs != at(start + x.shape()[d])) return {};
  const int64_t len = x.shape()[d] + y.shape()[d];
  return len == full[d] ? Tensor(o) : Tensor(o).narrow(d, start, len);
}

// A gradient along one dim as segments [at, at + len): zeros (t undefined) or
// a tensor's values.
struct Segment {
  int64_t at, len;
  Tensor t;
};

bool is_zeros(const TensorNode* n) {
  return n->op == Op::FULL && op_params<Op::FULL>(*n).value == 0.0f;
}

// The segments along dim d of a contribution: a zero PAD of d gives its
// padding zeros and its source's segments; a CONCAT along d its parts (a
// FULL 0 part zeros, as an earlier join leaves a gap); anything else itself.
std::vector<Segment> segments(const Tensor& g, int d) {
  const int64_t n = g.shape()[d];
  const auto i = size_t(d);
  PadParams p;
  Tensor x = g;
  if (padded_dim(g.node()) == d) {
    p = op_params<Op::PAD>(*g.node());
    x = Tensor(g.node()->src[0]);
  }
  std::vector<Segment> out;
  if (p.before[i] > 0) out.push_back({0, p.before[i], {}});
  int64_t at = p.before[i];
  const TensorNode* xn = x.node();
  if (xn->op == Op::CONCAT && op_params<Op::CONCAT>(*xn).dim == d) {
    for (int k = 0; k < xn->n_src; ++k) {
      const Tensor part(xn->src[k]);
      const int64_t len = part.shape()[d];
      out.push_back({at, len, is_zeros(part.node()) ? Tensor() : part});
      at += len;
    }
  } else {
    out.push_back({at, x.shape()[d], x});
    at += x.shape()[d];
  }
  if (at < n) out.push_back({at, n - at, {}});
  return out;
}

// The sum of two gradient contributions. Slices' gradients (narrow's rule: the
// slice's gradient padded with zeros) of disjoint ranges of one dim are joined
// into one padded CONCAT (of at most kMaxSrc parts) instead of padded and
// added: q, k and v split from one projection get one gradient tensor written
// once, whatever order the three arrive in (a gap between two slices is a
// zero part until the slice in between fills it). Adjacent parts that are
// views of one tensor at their places in it join as its view (joined_view):
// no copy at all.
Tensor sum_grads(Tensor a, Tensor b) {
  const int d = padded_dim(a.node()) >= 0 ? padded_dim(a.node()) : padded_dim(b.node());
  if (d < 0 || a.dtype() != b.dtype()) return add(a, b);
  const std::vector<Segment> sa = segments(a, d), sb = segments(b, d);
  // Merge: at every position at most one side may have values.
  std::vector<int64_t> cuts;
  for (const auto* v : {&sa, &sb})
    for (const Segment& s : *v) cuts.push_back(s.at);
  cuts.push_back(a.shape()[d]);
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  auto covering = [](const std::vector<Segment>& v, int64_t at) {
    for (const Segment& s : v)
      if (s.at <= at && at < s.at + s.len) return &s;
    return static_cast<const Segment*>(nullptr);
  };
  std::vector<Segment> merged;
  for (size_t k = 0; k + 1 < cuts.size(); ++k) {
    const int64_t at = cuts[k], len = cuts[k + 1] - at;
    const Segment *x = covering(sa, at), *y = covering(sb, at);
    if (x->t.defined() && y->t.defined()) return add(a, b);  // overlapping values
    const Segment* v = x->t.defined() ? x : y;
    if (!v->t.defined()) {
      if (!merged.empty() && !merged.back().t.defined()) merged.back().len += len;
      else merged.push_back({at, len, {}});
      continue;
    }
    if (v->at != at || v->len != len) return add(a, b);  // a part split: keep it whole
    merged.push_back(*v);
  }
  // Adjacent views of one tensor join as its view.
  std::vector<Segment> parts;
  for (const Segment& s : merged) {
    if (!parts.empty() && parts.back().t.defined() && s.t.defined()) {
      const Tensor j = joined_view(parts.back().t, s.t, d, parts.back().at, a.shape());
      if (j.defined()) {
        parts.back() = {parts.back().at, parts.back().len + s.len, j};
        continue;
      }
    }
    parts.push_back(s);
  }
  if (std::none_of(parts.begin(), parts.end(), [](const Segment& s) { return s.t.defined(); }))
    return add(a, b);
  // Zeros at either end are the PAD's; those in between zero parts.
  const auto i = size_t(d);
  PadParams p;
  if (!parts.front().t.defined()) {
    p.before[i] = parts.front().len;
    parts.erase(parts.begin());
  }
  if (!parts.back().t.defined()) {
    p.after[i] = parts.back().len;
    parts.pop_back();
  }
  if (parts.size() > size_t(kMaxSrc)) return add(a, b);
  std::vector<Tensor> ts;
  for (const Segment& s : parts) {
    if (s.t.defined()) {
      ts.push_back(s.t);
      continue;
    }
    Shape zs = a.shape();
    zs[d] = s.len;
    ts.push_back(zeros(a.ctx(), zs, a.dtype()));
  }
  const Tensor xy = concat(ts, d);
  if (p.before[i] == 0 && p.after[i] == 0) return xy;
  return Tensor(detail::new_op(Op::PAD, xy.dtype(), a.shape(), {xy.node()}, p));
}

}  // namespace

void Graph::backward(Tensor loss) {
  check_alive();
  if (!loss.defined()) fail("backward", "loss is an undefined tensor");
  if (!seen_.count(loss.node()))
    fail("backward", "loss is not part of this graph: build it with Graph::forward(loss)");
  if (loss.numel() != 1 || loss.dtype() != f32)
    fail("backward", "loss must be a one-element f32 tensor, got ", dtype_name(loss.dtype()), " ",
         loss.shape().str());
  if (!grads_.empty() || !accumulators_.empty())
    fail("backward", "this graph already has a backward pass");
  loss.node()->flags |= kFlagLoss;
  n_forward_ = nodes_.size();

  // 1. requires-grad: trainable params and nodes computed (differentiably) from
  // them. Frozen params are constants here: no gradient node, no accumulator.
  std::unordered_set<const TensorNode*> requires_grad;
  bool any_frozen = false;
  for (const TensorNode* l : leafs_) {
    if (!(l->flags & kFlagParam)) continue;
    if (l->flags & kFlagFrozen) {
      any_frozen = true;
    } else if (is_quantized(l->dtype)) {
      fail("backward", "param ", l->label(), " ", l->shape.str(), " is ", dtype_name(l->dtype),
           ": a quantized weight gets no gradient; freeze it (set_requires_grad(false), "
           "nn::Module::freeze) or train an f32 copy");
    } else {
      requires_grad.insert(l);
    }
  }
  for (const TensorNode* n : nodes_) {
    bool any = false;
    for (int i = 0; i < n->n_src; ++i) any |= n->src[i] && requires_grad.count(n->src[i]);
    if (!any) continue;
    if (op_kind(n->op) == OpKind::ALIAS)
      fail("backward", "in-place op '", op_name(n->op), "' (", n->label(),
           ") is on a gradient path; use an out-of-place op");
    if (op_has_grad(n->op)) requires_grad.insert(n);
  }
  if (!requires_grad.count(loss.node()))
    fail("backward", "the loss does not depend on any ",
         any_frozen ? "trainable param (the params it reads are frozen)" : "param");

  // 2. reverse pass from the loss.
  Context& ctx = loss.ctx();
  Tensor seed = full(ctx, loss.shape(), 1.0f);
  seed.node()->flags |= kFlagGrad;
  grads_[loss.node()] = seed.node();
  const size_t first_new = ctx.size();
  detail::Recompute re(std::span<TensorNode* const>(nodes_.data(), n_forward_));
  for (size_t k = n_forward_; k-- > 0;) {
    TensorNode* n = nodes_[k];
    auto it = grads_.find(n);
    if (it == grads_.end()) continue;
    bool needs[kMaxSrc] = {};
    bool any = false;
    for (int i = 0; i < n->n_src; ++i) {
      needs[i] = n->src[i] && requires_grad.count(n->src[i]);
      any |= needs[i];
    }
    if (!any) continue;
    detail::GradCtx g(n, Tensor(it->second), needs, re.active() ? &re : nullptr);
    detail::backward_rule(n->op)(g);
    for (int i = 0; i < n->n_src; ++i) {
      Tensor gi = g.added(i);
      if (!gi.defined()) continue;
      TensorNode* s = n->src[i];
      KILN_ASSERT(gi.shape() == s->shape);
      auto [pos, fresh] = grads_.emplace(s, gi.node());
      if (!fresh) pos->second = sum_grads(Tensor(pos->second), gi).node();
    }
  }
  // How many backward nodes read each node: a gradient product read only by
  // its accumulation is computed into the accumulator (detail::accumulate_grad).
  std::unordered_map<const TensorNode*, int> readers;
  for (size_t i = first_new; i < ctx.size(); ++i) {
    TensorNode* n = ctx.node(i);
    n->flags |= kFlagGrad;
    for (int j = 0; j < n->n_src; ++j) ++readers[n->src[j]];
  }

  // 3. accumulators: acc += grad, so gradients sum over runs until reset_grads().
  // Visited in reverse order of the params' first use, so the backward nodes come
  // out layer by layer from the loss back (the last layer's gradients are final
  // first, as in PyTorch): data-parallel training reduces early gradients while
  // the rest of the backward pass still runs (docs/distributed.md).
  const std::vector<TensorNode*> leafs(leafs_.rbegin(),
                                       leafs_.rend());  // visit() appends to leafs_
  for (TensorNode* p : leafs) {
    if (!(p->flags & kFlagParam) || (p->flags & kFlagFrozen)) continue;
    auto it = grads_.find(p);
    if (it == grads_.end()) continue;
    Tensor gp(it->second);
    const size_t first_acc_node = ctx.size();
    Tensor acc = ctx.tensor(f32, p->shape, p->name.empty() ? "grad" : p->name + ".grad");
    acc.node()->flags |= kFlagGrad | kFlagGradAcc;
    const TensorNode* prod = gp.node()->op == Op::PERMUTE ? gp.node()->src[0] : gp.node();
    const bool shared = readers[gp.node()] > 0 || (prod != gp.node() && readers[prod] > 1) ||
                        !(prod->flags & kFlagGrad);
    TensorNode* upd = detail::accumulate_grad(acc.node(), gp, shared);
    for (size_t i = first_acc_node; i < ctx.size(); ++i) ctx.node(i)->flags |= kFlagGrad;
    upd->flags |= kFlagOutput;
    accumulators_.emplace_back(p, acc.node());
    visit(upd);
  }
}

}  // namespace kiln
