// View ops (reshape, permute, narrow, expand) share their source's memory.
// Builders + backward rules.
#include <numeric>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

// A view node of `src` with the given layout; data is resolved now if the
// source already has memory (allocate_tensors resolves the rest later).
Tensor make_view(Op op, TensorNode* src, const Shape& s,
                 const std::array<int64_t, kMaxDims>& stride, int64_t offs,
                 const detail::OpParamBytes& p = {}) {
  TensorNode* n = detail::new_op(op, src->dtype, s, {src}, p);
  n->stride = stride;
  TensorNode* owner = src->view_src ? src->view_src : src;
  n->view_src = owner;
  n->view_offs = size_t(int64_t(src->view_offs) + offs);
  n->buffer = owner->buffer;
  if (owner->data) n->data = static_cast<char*>(owner->data) + n->view_offs;
  return Tensor(n);
}

// Replaces one -1 in `s` by the size that keeps numel (PyTorch's reshape(-1, n)).
Shape infer_dim(const char* op, const Shape& s, const Shape& from, int64_t numel) {
  Shape out = s;
  int infer = -1;
  int64_t known = 1;
  for (int d = 0; d < s.ndim(); ++d) {
    if (s[d] == -1) {
      if (infer >= 0) fail(op, "only one dim of ", s.str(), " may be -1");
      infer = d;
    } else if (__builtin_mul_overflow(known, s[d], &known)) {
      fail(op, "cannot reshape ", from.str(), " to ", s.str(),
           ": the element count overflows int64");
    }
  }
  if (infer >= 0) {
    if (known == 0 || numel % known != 0)
      fail(op, "cannot reshape ", from.str(), " (", numel, " elements) to ", s.str());
    out[infer] = numel / known;
  }
  return out;
}

}  // namespace

Tensor Tensor::view(const Shape& s_in) const {
  detail::check_defined("view", {*this});
  const Shape s = infer_dim("view", s_in, shape(), numel());
  if (s.checked_numel("view") != numel())
    fail("view", "cannot view ", shape().str(), " (", numel(), " elements) as ", s.str(), " (",
         s.numel(), " elements)");
  if (!node()->is_contiguous())
    fail("view", "tensor ", shape().str(), " is not contiguous; use reshape() or contiguous()");
  if (is_quantized(dtype()) &&
      (node()->quant_axis() != ndim() - 1 || s.ndim() == 0 || s[s.ndim() - 1] != size(-1)))
    fail("view", "cannot view ", dtype_name(dtype()), " ", shape().str(), " as ", s.str(),
         ": a quantized tensor keeps its last dim (its rows of blocks)");
  return make_view(Op::RESHAPE, node(), s, detail::contiguous_strides(s, node()->dtype), 0);
}

Tensor Tensor::reshape(const Shape& s_in) const {
  detail::check_defined("reshape", {*this});
  const Shape s = infer_dim("reshape", s_in, shape(), numel());
  if (s.checked_numel("reshape") != numel())
    fail("reshape", "cannot reshape ", shape().str(), " (", numel(), " elements) to ", s.str(),
         " (", s.numel(), " elements)");
  if (s == shape()) return *this;
  return node()->is_contiguous() ? view(s) : contiguous().view(s);
}

Tensor Tensor::permute(std::initializer_list<int> axes) const {
  detail::check_defined("permute", {*this});
  const int nd = ndim();
  if (int(axes.size()) != nd)
    fail("permute", "got ", axes.size(), " axes for a tensor ", shape().str());
  PermuteParams p;
  Shape s;
  std::array<int64_t, kMaxDims> st{};
  bool used[kMaxDims] = {};
  int d = 0;
  for (int a : axes) {
    const int ax = detail::norm_axis("permute", a, nd);
    if (used[ax]) fail("permute", "axis ", a, " appears twice for a tensor ", shape().str());
    used[ax] = true;
    p.axes[size_t(d)] = ax;
    s.push_back(shape()[ax]);
    st[d] = node()->stride[ax];
    ++d;
  }
  return make_view(Op::PERMUTE, node(), s, st, 0, detail::pack_params(p));
}

Tensor Tensor::transpose(int d0, int d1) const {
  detail::check_defined("transpose", {*this});
  const int nd = ndim();
  const int a = detail::norm_axis("transpose", d0, nd), b = detail::norm_axis("transpose", d1, nd);
  int axes[kMaxDims];
  std::iota(axes, axes + nd, 0);
  std::swap(axes[a], axes[b]);
  switch (nd) {
    case 2: return permute({axes[0], axes[1]});
    case 3: return permute({axes[0], axes[1], axes[2]});
    case 4: return permute({axes[0], axes[1], axes[2], axes[3]});
    default: return *this;
  }
}

Tensor Tensor::narrow(int dim, int64_t start, int64_t length) const {
  detail::check_defined("narrow", {*this});
  const int d = detail::norm_axis("narrow", dim, ndim());
  if (start < 0 || length < 0 || start + length > shape()[d])
    fail("narrow", "range [", start, ", ", start + length, ") is out of bounds for dim ", dim,
         " of ", shape().str());
  if (d == node()->quant_axis())
    fail("narrow", "cannot narrow dim ", dim, " of ", dtype_name(dtype()), " ", shape().str(),
         ": it runs along the quantized rows (blocks of ", dtype_block_elems(dtype()), ")");
  Shape s = shape();
  s[d] = length;
  return make_view(Op::NARROW, node(), s, node()->stride, start * node()->stride[d],
                   detail::pack_params(NarrowParams{d, start, length}));
}

Tensor Tensor::expand(const Shape& s) const {
  detail::check_defined("expand", {*this});
  const int nd = s.ndim(), off = nd - ndim();
  if (off < 0) fail("expand", "cannot expand ", shape().str(), " to fewer dimensions ", s.str());
  std::array<int64_t, kMaxDims> st{};
  for (int i = 0; i < nd; ++i) {
    const int j = i - off;
    if (j < 0) {
      st[i] = 0;
    } else if (shape()[j] == s[i] || s[i] == -1) {
      st[i] = node()->stride[j];
    } else if (shape()[j] == 1) {
      st[i] = 0;
    } else {
      fail("expand", "cannot expand ", shape().str(), " to ", s.str(), ": dim ", j, " is ",
           shape()[j], ", not 1 or ", s[i]);
    }
  }
  Shape out = s;
  for (int i = off; i < nd; ++i)
    if (out[i] == -1) out[i] = shape()[i - off];
  for (int i = 0; i < off; ++i)
    if (out[i] < 0)
      fail("expand", "-1 is not allowed for the new leading dim ", i, " in ", s.str());
  if (out == shape()) return *this;
  return make_view(Op::EXPAND, node(), out, st, 0);
}

namespace detail {

void backward_RESHAPE(GradCtx& g) { g.add(0, g.grad().reshape(g.src(0).shape())); }

void backward_PERMUTE(GradCtx& g) {
  const PermuteParams p = g.params<Op::PERMUTE>();
  const int nd = g.out().ndim();
  int inv[kMaxDims] = {};
  for (int d = 0; d < nd; ++d) inv[p.axes[size_t(d)]] = d;
  Tensor gr = g.grad();
  switch (nd) {
    case 2: g.add(0, gr.permute({inv[0], inv[1]})); break;
    case 3: g.add(0, gr.permute({inv[0], inv[1], inv[2]})); break;
    case 4: g.add(0, gr.permute({inv[0], inv[1], inv[2], inv[3]})); break;
    default: g.add(0, gr); break;
  }
}

void backward_NARROW(GradCtx& g) {
  // The gradient of a slice is the slice's gradient padded with zeros.
  const NarrowParams q = g.params<Op::NARROW>();
  const Tensor src = g.src(0);
  PadParams p;
  const auto d = size_t(q.dim);
  p.before[d] = q.start;
  p.after[d] = src.shape()[int(d)] - q.start - q.length;
  g.add(0, make_op(Op::PAD, g.grad().dtype(), src.shape(), {g.grad()}, p));
}

void backward_EXPAND(GradCtx& g) { g.add(0, sum_to(g.grad(), g.src(0).shape())); }

}  // namespace detail
}  // namespace kiln
