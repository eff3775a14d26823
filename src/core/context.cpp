#include "kiln/context.h"

#include <deque>

#include "kiln/ext/op_builder.h"
#include "kiln/ext/tensor_node.h"

namespace kiln {

size_t detail::checked_nbytes(const char* op, const std::string& name, DType t, const Shape& s) {
  const std::string who = name.empty() ? "tensor " : "tensor '" + name + "' ";
  for (int64_t d : s)
    if (d < 0) fail(op, who, s.str(), ": dimension sizes must be >= 0");
  int64_t n = 1;
  for (int64_t d : s)
    if (d == 0) return 0;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      fail(op, who, s.str(), ": the element count overflows int64");
  int64_t bytes = 0;
  if (__builtin_mul_overflow(n / dtype_block_elems(t), int64_t(dtype_size(t)), &bytes))
    fail(op, who, s.str(), " ", dtype_name(t), ": ", n,
         " elements need more bytes than fit in int64");
  return size_t(bytes);
}

namespace {

// A quantized tensor that owns its memory is rows of whole blocks (its views
// may move that dim: TensorNode::quant_axis).
void check_blocks(const char* op, const std::string& name, DType t, const Shape& s) {
  if (is_quantized(t) && (s.ndim() == 0 || s[s.ndim() - 1] % dtype_block_elems(t) != 0))
    fail(op, name.empty() ? "tensor " : "tensor '" + name + "' ", s.str(), " ", dtype_name(t),
         ": a quantized tensor's last dim must be a multiple of ", dtype_block_elems(t),
         " (whole blocks)");
}

}  // namespace

struct Context::Nodes : std::deque<TensorNode> {};

Context::Context() : nodes_(std::make_unique<Nodes>()) {}
Context::~Context() = default;
void Context::set_matmul_precision(DType t) {
  if (t != DType::f32 && t != DType::bf16)
    fail("matmul precision", "must be f32 or bf16, got ", dtype_name(t));
  matmul_precision_ = t;
}

size_t Context::size() const { return nodes_->size(); }
TensorNode* Context::node(size_t i) { return &(*nodes_)[i]; }

TensorNode* Context::new_node(DType t, const Shape& s, Op op) {
  detail::checked_nbytes(op_name(op), {}, t, s);
  if (op_kind(op) != OpKind::VIEW) check_blocks(op_name(op), {}, t, s);
  TensorNode& n = nodes_->emplace_back();
  n.id = int64_t(nodes_->size() - 1);
  n.dtype = t;
  n.shape = s;
  n.stride = detail::contiguous_strides(s, t);
  n.op = op;
  n.ctx = this;
  return &n;
}

static Tensor leaf(Context& c, const char* what, DType t, const Shape& s, std::string name,
                   uint32_t flags) {
  detail::checked_nbytes(what, name, t, s);
  check_blocks(what, name, t, s);
  TensorNode* n = c.new_node(t, s, Op::NONE);
  n->name = std::move(name);
  n->flags = flags;
  return Tensor(n);
}

Tensor Context::input(DType t, const Shape& s, std::string name) {
  return leaf(*this, "input", t, s, std::move(name), kFlagInput);
}
Tensor Context::param(DType t, const Shape& s, std::string name) {
  if (!is_floating(t)) fail("param", "parameters must be floating point, got ", dtype_name(t));
  return leaf(*this, "param", t, s, std::move(name), kFlagParam);
}
Tensor Context::tensor(DType t, const Shape& s, std::string name) {
  return leaf(*this, "tensor", t, s, std::move(name), 0);
}

}  // namespace kiln
