// TensorNode layout queries and the Tensor handle's metadata. Data access
// (Tensor::set/get) needs buffers and lives in the backend layer
// (src/backend/tensor_data.cpp).
#include "kiln/tensor.h"

namespace kiln {

bool TensorNode::is_contiguous() const {
  int64_t expect = int64_t(elem_size());
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    if (shape[d] != 1 && stride[d] != expect) return false;
    expect *= shape[d];
  }
  return true;
}

int64_t TensorNode::offset_of(const int64_t* idx) const {
  int64_t o = 0;
  for (int d = 0; d < shape.ndim(); ++d) o += idx[d] * stride[d];
  return o;
}

int64_t Tensor::size(int dim) const {
  const int n = ndim();
  const int d = dim < 0 ? dim + n : dim;
  if (d < 0 || d >= n) fail("size", "dim ", dim, " is out of range for ", shape().str());
  return shape()[d];
}

Tensor& Tensor::set_name(std::string name) {
  n_->name = std::move(name);
  return *this;
}

void detail::set_flags(Tensor t, uint32_t f) { t.node()->flags |= f; }

}  // namespace kiln
