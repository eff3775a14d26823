// TensorNode layout queries and the Tensor handle's metadata. Data access
// (Tensor::set/get) needs buffers and lives in the backend layer
// (src/backend/tensor_data.cpp).
#include "kiln/tensor.h"
#include "kiln/context.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"

namespace kiln {

const detail::LifeToken& detail::immortal_life() {
  static const LifeToken token = std::make_shared<int>(0);
  return token;
}

void detail::fail_dead_context(const char* what) {
  fail(what,
       "used after its kiln::Context was destroyed: a Tensor or Graph must not outlive "
       "the Context that built it");
}

Tensor::Tensor(TensorNode* n) : n_(n) {
  if (n) life_ = n->ctx ? n->ctx->life() : detail::immortal_life();
}

bool TensorNode::is_contiguous() const {
  // A quantized view whose blocks run along another dim (W.T()) is never
  // contiguous, even where its strides happen to look it (one block per row).
  if (is_quantized(dtype) && shape.ndim() > 0 && quant_axis() != shape.ndim() - 1) return false;
  int64_t expect = int64_t(elem_size());
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    // A quantized last dim steps by blocks: its row is shape / block_elems blocks.
    expect *= d == shape.ndim() - 1 ? shape[d] / dtype_block_elems(dtype) : shape[d];
  }
  return true;
}

int TensorNode::quant_axis() const {
  if (!is_quantized(dtype)) return -1;
  if (op == Op::PERMUTE && src[0]) {
    const int from = src[0]->quant_axis();
    const auto& axes = op_params<Op::PERMUTE>(*this).axes;
    for (int d = 0; d < shape.ndim(); ++d)
      if (int(axes[size_t(d)]) == from) return d;
  }
  if (op == Op::NARROW && src[0]) return src[0]->quant_axis();
  return shape.ndim() - 1;  // owners, and reshapes (which keep the last dim)
}

std::string TensorNode::label() const {
  std::string s = "#";  // built with += (GCC 12 warns falsely on "#" + string)
  s += std::to_string(id);
  if (!name.empty()) s.append(" '").append(name).append("'");
  return s;
}

int64_t TensorNode::offset_of(const int64_t* idx) const {
  int64_t o = 0;
  for (int d = 0; d < shape.ndim(); ++d) o += idx[d] * stride[d];
  return o;
}

DType Tensor::dtype() const { return node()->dtype; }
const Shape& Tensor::shape() const { return node()->shape; }
int Tensor::ndim() const { return node()->shape.ndim(); }
int64_t Tensor::numel() const { return node()->numel(); }
Op Tensor::op() const { return node()->op; }
const std::string& Tensor::name() const { return node()->name; }
std::string Tensor::label() const { return node()->label(); }
bool Tensor::has_flag(TensorFlag f) const { return (node()->flags & f) != 0; }
Context& Tensor::ctx() const { return *node()->ctx; }

bool Tensor::requires_grad() const {
  const uint32_t f = node()->flags;
  return (f & kFlagParam) && !(f & kFlagFrozen);
}

Tensor& Tensor::set_requires_grad(bool on) {
  TensorNode* n = node();
  if (!(n->flags & kFlagParam)) {
    if (!on) return *this;  // nothing gets a gradient that is not a param
    fail("tensor", "set_requires_grad: ", n->label(),
         " is not a param; only tensors made by Context::param get gradients");
  }
  if (on) n->flags &= ~uint32_t(kFlagFrozen);
  else n->flags |= kFlagFrozen;
  return *this;
}
bool Tensor::has_data() const { return node()->data != nullptr; }

int64_t Tensor::size(int dim) const {
  const int n = ndim();
  const int d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n) fail("size", "dim ", dim, " is out of range for ", shape().str());
  return shape()[d];
}

Tensor& Tensor::set_name(std::string name) {
  node()->name = std::move(name);
  return *this;
}

void detail::set_flags(Tensor t, uint32_t f) { t.node()->flags |= f; }

}  // namespace kiln
