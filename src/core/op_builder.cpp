#include "kiln/ext/op_builder.h"

namespace kiln::detail {

std::array<int64_t, kMaxDims> contiguous_strides(const Shape& s, size_t elem_size) {
  std::array<int64_t, kMaxDims> st{};
  int64_t acc = int64_t(elem_size);
  for (int d = s.ndim() - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

std::array<int64_t, kMaxDims> contiguous_strides(const Shape& s, DType t) {
  if (!is_quantized(t) || s.ndim() == 0) return contiguous_strides(s, dtype_size(t));
  std::array<int64_t, kMaxDims> st{};
  const int last = s.ndim() - 1;
  st[last] = int64_t(dtype_size(t));
  int64_t acc = int64_t(dtype_row_bytes(t, s[last]));
  for (int d = last - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

namespace {

// The ops a quantized tensor may enter: the views that keep its rows whole
// (their builders check the rest), COPY (dequantize / quantize), MATMUL and
// EXPERT_MATMUL (as the weight) and EMBEDDING (as the table; f32 rows out).
bool accepts_quantized(Op op) {
  return op == Op::PERMUTE || op == Op::NARROW || op == Op::RESHAPE || op == Op::COPY ||
         op == Op::MATMUL || op == Op::EXPERT_MATMUL || op == Op::EMBEDDING;
}

void check_quantized(Op op, DType t, std::initializer_list<TensorNode*> srcs) {
  if (accepts_quantized(op)) return;
  if (is_quantized(t))
    fail(op_name(op), "cannot make a ", dtype_name(t),
         " tensor: only copy (to), views, "
         "matmul, expert_matmul and embedding take quantized tensors");
  for (TensorNode* x : srcs)
    if (x && is_quantized(x->dtype))
      fail(op_name(op), "does not take quantized tensors: ", x->label(), " ", x->shape.str(),
           " is ", dtype_name(x->dtype),
           " (dequantize it with .to(f32), or use it as the "
           "weight of matmul(x, w.T()))");
}

}  // namespace

TensorNode* new_op(Op op, DType t, const Shape& s, std::initializer_list<TensorNode*> srcs,
                   const OpParamBytes& p) {
  check_quantized(op, t, srcs);
  Context* ctx = nullptr;
  for (TensorNode* x : srcs)
    if (x) {
      ctx = x->ctx;
      break;
    }
  KILN_ASSERT(ctx != nullptr);
  TensorNode* n = ctx->new_node(t, s, op);
  n->params = p;
  int i = 0;
  for (TensorNode* x : srcs) {
    KILN_ASSERT(i < kMaxSrc);
    n->src[i++] = x;
  }
  n->n_src = i;
  while (n->n_src > 0 && n->src[n->n_src - 1] == nullptr) n->n_src--;
  return n;
}

void check_defined(const char* op, std::initializer_list<Tensor> ts) {
  int i = 0;
  for (const Tensor& t : ts) {
    if (!t.defined()) fail(op, "argument ", i, " is an undefined tensor");
    ++i;
  }
}

void check_dtype(const char* op, const char* what, Tensor t, DType want) {
  if (t.dtype() != want)
    fail(op, what, " must be ", dtype_name(want), " but is ", dtype_name(t.dtype()), " ",
         t.shape().str());
}

void check_float32(const char* op, const char* what, Tensor t) { check_dtype(op, what, t, f32); }

void check_same_ctx(const char* op, std::initializer_list<Tensor> ts) {
  const Context* c = nullptr;
  for (const Tensor& t : ts) {
    if (!t.defined()) continue;
    if (c && t.node()->ctx != c) fail(op, "tensors come from different contexts");
    c = t.node()->ctx;
  }
}

int norm_axis(const char* op, int axis, int ndim) {
  const int a = axis < 0 ? axis + ndim : axis;
  if (a < 0 || a >= ndim)
    fail(op, "axis ", axis, " is out of range for a tensor with ", ndim, " dimensions");
  return a;
}

Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b) {
  const int n = std::max(a.ndim(), b.ndim());
  Shape out;
  for (int i = 0; i < n; ++i) {
    const int ia = i - (n - a.ndim()), ib = i - (n - b.ndim());
    const int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1)
      fail(op, "shapes ", a.str(), " and ", b.str(), " cannot be broadcast together");
    out.push_back(da == 1 ? db : da);
  }
  return out;
}

}  // namespace kiln::detail

namespace kiln {

Tensor detail::make_op_bytes(Op op, DType t, const Shape& s, std::initializer_list<Tensor> srcs,
                             const OpParamBytes& p) {
  if (srcs.size() > size_t(kMaxSrc)) fail(op_name(op), "at most ", kMaxSrc, " sources");
  if (srcs.size() == 0) fail(op_name(op), "make_op needs at least one source (for its context)");
  TensorNode* ns[kMaxSrc] = {};
  int i = 0;
  for (const Tensor& x : srcs) ns[i++] = x.node();
  static_assert(kMaxSrc == 7);
  return Tensor(detail::new_op(op, t, s, {ns[0], ns[1], ns[2], ns[3], ns[4], ns[5], ns[6]}, p));
}

}  // namespace kiln
