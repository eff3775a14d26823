#include <sstream>

#include "kiln/tensor.h"

namespace kiln {

namespace {
void check_rank(size_t n) {
  if (n > size_t(kMaxDims))
    fail("shape", "a tensor has at most ", kMaxDims, " dimensions, got ", n);
}
// -1 is allowed as a placeholder ("infer this dim") for reshape/view/expand;
// tensors themselves are created only with sizes >= 0 (Context::new_node).
void check_dim(int64_t v) {
  if (v < -1) fail("shape", "dimension sizes must be >= 0 (or -1 to infer), got ", v);
}
}  // namespace

Shape::Shape(std::initializer_list<int64_t> dims) {
  check_rank(dims.size());
  for (int64_t v : dims) {
    check_dim(v);
    d_[n_++] = v;
  }
}

Shape::Shape(std::span<const int64_t> dims) {
  check_rank(dims.size());
  for (int64_t v : dims) {
    check_dim(v);
    d_[n_++] = v;
  }
}

void Shape::push_back(int64_t v) {
  check_rank(size_t(n_) + 1);
  check_dim(v);
  d_[n_++] = v;
}

int64_t Shape::checked_numel(const char* op) const {
  // A zero dim makes the count 0 whatever the others are (as PyTorch's numel).
  for (int i = 0; i < n_; ++i)
    if (d_[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < n_; ++i)
    if (__builtin_mul_overflow(n, d_[i], &n))
      fail(op, "the element count of ", str(), " overflows int64");
  return n;
}

bool Shape::operator==(const Shape& o) const {
  if (n_ != o.n_) return false;
  for (int i = 0; i < n_; ++i)
    if (d_[i] != o.d_[i]) return false;
  return true;
}

std::string Shape::str() const {
  std::ostringstream os;
  os << "[";
  for (int i = 0; i < n_; ++i) os << (i ? ", " : "") << d_[i];
  os << "]";
  return os.str();
}

}  // namespace kiln
