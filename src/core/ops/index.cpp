// Indexing and data-movement builders: one_hot (ONE_HOT), embedding (EMBEDDING)
// and its adjoint SCATTER_ADD_ROWS, concat, pad, repeat (and REPEAT_BACK), with
// backward rules.
//
// Semantics decisions (PyTorch unless noted):
// - one_hot: f32 result (not int64 as in PyTorch); `classes` must be given (> 0)
//   because graphs are data-free; labels rank <= 3.
// - gather_last (torch.gather(x, -1, idx)): a composite of one_hot, mul and
//   sum, for small last dims (routing over experts); x f32, rank < kMaxDims.
// - embedding: weight [V, D] (f32, f16, bf16, or q8_0 / q4_0 read as stored:
//   each row's blocks dequantized), indices i32 of rank 0..3 -> f32 [..., D]. No
//   padding_idx / max_norm. Out-of-range indices are reported at run time by the
//   kernel ("[embedding] index 70 at position 5 is out of range for 50 rows").
//   A quantized table is frozen: no gradient flows into it.
// - concat (torch.cat): every tensor has the same ndim and dtype, sizes match
//   except along `dim`; a one-element list returns that tensor itself. The
//   primitive takes 2 to kMaxSrc (7) parts, so more tensors become a chain of
//   CONCAT nodes (errors are checked up front and name the original
//   positions). Any dtype.
// - pad (F.pad, constant mode): pairs (before, after) from the LAST dim; fewer
//   pairs than dims leave the leading dims alone; negative pads (cropping) are not
//   supported. Any dtype (the fill value is converted).
// - repeat (torch.Tensor.repeat): reps.size() >= ndim, missing leading dims are
//   prepended as size 1; result rank <= 4; every rep >= 1 (no empty tensors).
#include <algorithm>
#include <vector>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor one_hot(Tensor labels, int64_t classes) {
  detail::check_defined("one_hot", {labels});
  detail::check_dtype("one_hot", "labels", labels, i32);
  if (classes <= 0) fail("one_hot", "classes must be > 0, got ", classes);
  if (labels.ndim() >= kMaxDims)
    fail("one_hot", "labels ", labels.shape().str(), " have ", labels.ndim(),
         " dimensions; at most ", kMaxDims - 1, " are supported");
  Shape s = labels.shape();
  s.push_back(classes);
  return Tensor(detail::new_op(Op::ONE_HOT, f32, s, {labels.node()}, OneHotParams{classes, false}));
}

Tensor embedding(Tensor weight, Tensor indices) {
  detail::check_defined("embedding", {weight, indices});
  detail::check_same_ctx("embedding", {weight, indices});
  // f16/bf16 tables (weights kept as stored) and q8_0/q4_0 ones give f32 rows.
  if (weight.dtype() == i32)
    fail("embedding", "weight must be f32, f16, bf16, q8_0 or q4_0, got i32 ",
         weight.shape().str());
  detail::check_dtype("embedding", "indices", indices, i32);
  if (weight.ndim() != 2) fail("embedding", "weight must be [V, D], got ", weight.shape().str());
  if (is_quantized(weight.dtype()) && weight.node()->quant_axis() != 1)
    fail("embedding", "weight ", weight.shape().str(), " is a transposed view of a ",
         dtype_name(weight.dtype()), " tensor: a quantized table's rows must be its stored rows");
  if (indices.ndim() >= kMaxDims)
    fail("embedding", "indices ", indices.shape().str(), " have ", indices.ndim(),
         " dimensions; at most ", kMaxDims - 1, " are supported");
  Shape s = indices.shape();
  s.push_back(weight.shape()[1]);
  return Tensor(detail::new_op(Op::EMBEDDING, f32, s, {weight.node(), indices.node()}));
}

Tensor gather_last(Tensor x, Tensor idx) {
  detail::check_defined("gather_last", {x, idx});
  detail::check_same_ctx("gather_last", {x, idx});
  detail::check_float32("gather_last", "x", x);
  detail::check_dtype("gather_last", "idx", idx, i32);
  bool ok = x.ndim() >= 1 && idx.ndim() == x.ndim();
  for (int d = 0; ok && d < x.ndim() - 1; ++d) ok = x.size(d) == idx.size(d);
  if (!ok)
    fail("gather_last", "x is ", x.shape().str(), " and idx ", idx.shape().str(),
         ": idx must have x's dims but the last");
  // x [..., 1, C] * one_hot [..., k, C], summed over C.
  Shape xs;
  for (int d = 0; d < x.ndim() - 1; ++d) xs.push_back(x.size(d));
  xs.push_back(1);
  xs.push_back(x.size(-1));
  return sum(x.reshape(xs) * one_hot(idx, x.size(-1)), -1);
}

namespace {

// One CONCAT node of 2 to kMaxSrc parts.
Tensor concat_node(const Tensor* parts, int n, int dim) {
  Shape s = parts[0].shape();
  TensorNode* srcs[kMaxSrc] = {};
  for (int i = 0; i < n; ++i) {
    if (i > 0) s[dim] += parts[i].shape()[dim];
    srcs[i] = parts[i].node();
  }
  const std::initializer_list<TensorNode*> all[] = {
      {srcs[0], srcs[1]},
      {srcs[0], srcs[1], srcs[2]},
      {srcs[0], srcs[1], srcs[2], srcs[3]},
      {srcs[0], srcs[1], srcs[2], srcs[3], srcs[4]},
      {srcs[0], srcs[1], srcs[2], srcs[3], srcs[4], srcs[5]},
      {srcs[0], srcs[1], srcs[2], srcs[3], srcs[4], srcs[5], srcs[6]}};
  static_assert(kMaxSrc == 7);
  return Tensor(detail::new_op(Op::CONCAT, parts[0].dtype(), s, all[n - 2], ConcatParams{dim}));
}

template <class It>
Tensor concat_impl(It first, It last, int dim) {
  const char* op = "concat";
  const size_t n = size_t(last - first);
  if (n == 0) fail(op, "needs at least one tensor");
  for (size_t i = 0; i < n; ++i)
    if (!first[i].defined()) fail(op, "tensor ", i, " is undefined");
  const Tensor t0 = first[0];
  const int nd = t0.ndim();
  if (nd == 0) fail(op, "cannot concatenate scalars (tensor 0 is ", t0.shape().str(), ")");
  const int d = detail::norm_axis(op, dim, nd);
  for (size_t i = 1; i < n; ++i) {
    const Tensor t = first[i];
    detail::check_same_ctx(op, {t0, t});
    if (t.dtype() != t0.dtype())
      fail(op, "tensor ", i, " is ", dtype_name(t.dtype()), " ", t.shape().str(),
           " but tensor 0 is ", dtype_name(t0.dtype()), " ", t0.shape().str());
    bool ok = t.ndim() == nd;
    for (int k = 0; ok && k < nd; ++k) ok = k == d || t.shape()[k] == t0.shape()[k];
    if (!ok)
      fail(op, "tensor ", i, " is ", t.shape().str(), " but tensor 0 is ", t0.shape().str(),
           " (sizes must match except in dim ", d, ")");
  }
  // One node of up to kMaxSrc parts; more: a chain, each node's first part
  // the previous node.
  std::vector<Tensor> parts(first, last);
  if (n == 1) return t0;
  Tensor out = concat_node(parts.data(), int(std::min<size_t>(n, kMaxSrc)), d);
  for (size_t i = kMaxSrc; i < n; i += kMaxSrc - 1) {
    Tensor next[kMaxSrc] = {out};
    const size_t m = std::min<size_t>(n - i, kMaxSrc - 1);
    for (size_t j = 0; j < m; ++j) next[j + 1] = parts[i + j];
    out = concat_node(next, int(m + 1), d);
  }
  return out;
}

}  // namespace

Tensor concat(std::initializer_list<Tensor> xs, int dim) {
  return concat_impl(xs.begin(), xs.end(), dim);
}

Tensor concat(const std::vector<Tensor>& xs, int dim) {
  return concat_impl(xs.begin(), xs.end(), dim);
}

Tensor pad(Tensor x, std::initializer_list<int64_t> pads, float value) {
  detail::check_defined("pad", {x});
  const int nd = x.ndim();
  const int np = int(pads.size());
  if (np % 2 != 0)
    fail("pad", "pads must come in (before, after) pairs, got ", np, " values for x ",
         x.shape().str());
  if (np / 2 > nd)
    fail("pad", "got ", np / 2, " (before, after) pairs for x ", x.shape().str(), " with ", nd,
         " dimensions");
  PadParams p;
  p.value = value;
  Shape s = x.shape();
  int k = 0;
  for (const int64_t* it = pads.begin(); it != pads.end(); it += 2, ++k) {
    const int d = nd - 1 - k;  // pairs start from the last dim
    if (it[0] < 0 || it[1] < 0)
      fail("pad", "negative padding (", it[0], ", ", it[1], ") for dim ", d, " of x ",
           x.shape().str(), " is not supported");
    p.before[size_t(d)] = it[0];
    p.after[size_t(d)] = it[1];
    s[d] += it[0] + it[1];
  }
  if (s == x.shape()) return x;
  return Tensor(detail::new_op(Op::PAD, x.dtype(), s, {x.node()}, p));
}

Tensor repeat(Tensor x, std::initializer_list<int64_t> reps) {
  detail::check_defined("repeat", {x});
  const int nd = x.ndim(), nr = int(reps.size());
  if (nr < nd)
    fail("repeat", "got ", nr, " repeats for x ", x.shape().str(), " with ", nd,
         " dimensions (need at least ", nd, ")");
  if (nr > kMaxDims)
    fail("repeat", "got ", nr, " repeats for x ", x.shape().str(), "; the result may have at most ",
         kMaxDims, " dimensions");
  Shape src, out;  // x with prepended size-1 dims, and the result
  int d = 0;
  for (int64_t r : reps) {
    const int j = d - (nr - nd);
    const int64_t sz = j >= 0 ? x.shape()[j] : 1;
    if (r < 1)
      fail("repeat", "repeats must be >= 1, got ", r, " for dim ", d, " (x is ", x.shape().str(),
           ")");
    src.push_back(sz);
    out.push_back(sz * r);
    ++d;
  }
  if (out == src) return nr == nd ? x : x.reshape(src);
  Tensor xs = nr == nd ? x : x.reshape(src);
  return Tensor(detail::new_op(Op::REPEAT, x.dtype(), out, {xs.node()}));
}

namespace detail {

void backward_EMBEDDING(GradCtx& g) {
  if (!g.needs(0)) return;
  const Tensor w = g.src(0), idx = g.src(1);
  if (is_quantized(w.dtype()))
    fail("embedding", "the quantized table ", w.label(), " ", w.shape().str(), " is ",
         dtype_name(w.dtype()), " and gets no gradient: it must be frozen");
  g.add(0, Tensor(new_op(Op::SCATTER_ADD_ROWS, f32, w.shape(), {g.grad().node(), idx.node()},
                         ScatterAddRowsParams{w.shape()[0]})));
}

void backward_SCATTER_ADD_ROWS(GradCtx& g) {
  if (!g.needs(0)) return;
  const Tensor idx = g.src(1);
  g.add(0, Tensor(new_op(Op::EMBEDDING, f32, g.src(0).shape(), {g.grad().node(), idx.node()})));
}

void backward_CONCAT(GradCtx& g) {
  const int d = int(g.params<Op::CONCAT>().dim);
  int64_t at = 0;
  for (int i = 0; i < g.out().node()->n_src; ++i) {
    const int64_t len = g.src(i).shape()[d];
    if (g.needs(i)) g.add(i, g.grad().narrow(d, at, len));
    at += len;
  }
}

void backward_PAD(GradCtx& g) {
  if (!g.needs(0)) return;
  const Tensor x = g.src(0);
  Tensor gr = g.grad();
  const PadParams p = g.params<Op::PAD>();
  for (int d = 0; d < x.ndim(); ++d)
    if (gr.shape()[d] != x.shape()[d]) gr = gr.narrow(d, p.before[size_t(d)], x.shape()[d]);
  g.add(0, gr);
}

void backward_REPEAT(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::REPEAT_BACK, f32, g.src(0).shape(), {g.grad().node()})));
}

void backward_REPEAT_BACK(GradCtx& g) {
  if (!g.needs(0)) return;
  g.add(0, Tensor(new_op(Op::REPEAT, f32, g.src(0).shape(), {g.grad().node()})));
}

}  // namespace detail

}  // namespace kiln
