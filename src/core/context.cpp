#include "kiln/context.h"

#include "kiln/detail/op_builder.h"

namespace kiln {

TensorNode* Context::new_node(DType t, const Shape& s, Op op) {
  for (int64_t d : s)
    if (d < 0) fail(op_name(op), "dimension sizes must be >= 0, got ", s.str());
  TensorNode& n = nodes_.emplace_back();
  n.id = int64_t(nodes_.size() - 1);
  n.dtype = t;
  n.shape = s;
  n.stride = detail::contiguous_strides(s, dtype_size(t));
  n.op = op;
  n.ctx = this;
  return &n;
}

static Tensor leaf(Context& c, DType t, const Shape& s, std::string name, uint32_t flags) {
  TensorNode* n = c.new_node(t, s, Op::NONE);
  n->name = std::move(name);
  n->flags = flags;
  return Tensor(n);
}

Tensor Context::input(DType t, const Shape& s, std::string name) {
  return leaf(*this, t, s, std::move(name), kFlagInput);
}
Tensor Context::param(DType t, const Shape& s, std::string name) {
  if (!is_floating(t)) fail("param", "parameters must be floating point, got ", dtype_name(t));
  return leaf(*this, t, s, std::move(name), kFlagParam);
}
Tensor Context::tensor(DType t, const Shape& s, std::string name) {
  return leaf(*this, t, s, std::move(name), 0);
}

}  // namespace kiln
