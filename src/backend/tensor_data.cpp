// The Tensor handle's data access (declared in kiln/tensor.h): through the
// tensor's Buffer, so it belongs to the backend layer, not to core.
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kiln/backend.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {

template <class T>
bool dtype_matches(DType t) {
  if constexpr (std::is_same_v<T, float>) return t == DType::f32;
  if constexpr (std::is_same_v<T, int32_t>) return t == DType::i32;
  if constexpr (std::is_same_v<T, uint16_t>) return t == DType::f16 || t == DType::bf16;
  if constexpr (std::is_same_v<T, uint8_t>) return false;  // block bytes of quantized tensors
  return false;
}

void check_access(const char* op, const TensorNode* n, size_t count, bool dtype_ok) {
  if (!dtype_ok)
    fail(op, "tensor ", n->label(), " ", n->shape.str(), " is ", dtype_name(n->dtype),
         ": use float for f32, int32_t for i32, uint16_t for f16/bf16");
  if (!n->data)
    fail(op, "tensor ", n->label(), " ", n->shape.str(),
         " has no memory yet: allocate it first (kiln::allocate_tensors or a graph allocator)");
  if (count != size_t(n->numel()))
    fail(op, "tensor ", n->label(), " ", n->shape.str(), " has ", n->numel(), " elements but ",
         count, " values were given");
}

// Calls fn(byte_offset, linear_index) for each element in row-major order.
template <class F>
void for_each_offset(const TensorNode* n, F&& fn) {
  const int nd = n->shape.ndim();
  int64_t idx[kMaxDims] = {};
  const int64_t total = n->numel();
  for (int64_t i = 0; i < total; ++i) {
    fn(n->offset_of(idx), i);
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < n->shape[d]) break;
      idx[d] = 0;
    }
  }
}

void check_quantized_access(const char* op, const TensorNode* n, size_t count, size_t want) {
  if (!n->data)
    fail(op, "tensor ", n->label(), " ", n->shape.str(),
         " has no memory yet: allocate it first (kiln::allocate_tensors or a graph allocator)");
  if (!n->is_contiguous())
    fail(op, "tensor ", n->label(), " is a ", dtype_name(n->dtype),
         " view that is not contiguous: access its source");
  if (count != want)
    fail(op, "tensor ", n->label(), " ", n->shape.str(), " ", dtype_name(n->dtype), " needs ", want,
         " values but ", count, " were given");
}

// Quantized tensors: float values (quantized / dequantized per row) or the
// stored block bytes (uint8_t).
template <class V>
void set_quantized(TensorNode* n, std::span<const V> values) {
  if constexpr (std::is_same_v<V, float>) {
    check_quantized_access("set", n, values.size(), size_t(n->numel()));
    std::vector<uint8_t> bytes(n->nbytes());
    const int64_t k = n->shape[n->shape.ndim() - 1];
    const size_t rb = dtype_row_bytes(n->dtype, k);
    for (int64_t r = 0; k > 0 && r < n->numel() / k; ++r)
      quantize_row(n->dtype, values.data() + r * k, bytes.data() + size_t(r) * rb, k);
    if (!bytes.empty()) n->buffer->set(n, bytes.data(), 0, bytes.size());
  } else if constexpr (std::is_same_v<V, uint8_t>) {
    check_quantized_access("set", n, values.size(), n->nbytes());
    if (!values.empty()) n->buffer->set(n, values.data(), 0, values.size());
  } else {
    fail("set", "tensor ", n->label(), " is ", dtype_name(n->dtype),
         ": use float (quantized on set) or uint8_t (block bytes)");
  }
}

template <class V>
std::vector<V> get_quantized(const TensorNode* n) {
  if constexpr (std::is_same_v<V, float>) {
    std::vector<float> out(size_t(n->numel()));
    check_quantized_access("get", n, out.size(), out.size());
    std::vector<uint8_t> bytes(n->nbytes());
    if (!bytes.empty()) n->buffer->get(n, bytes.data(), 0, bytes.size());
    const int64_t k = n->shape[n->shape.ndim() - 1];
    const size_t rb = dtype_row_bytes(n->dtype, k);
    for (int64_t r = 0; k > 0 && r < n->numel() / k; ++r)
      dequantize_row(n->dtype, bytes.data() + size_t(r) * rb, out.data() + r * k, k);
    return out;
  } else if constexpr (std::is_same_v<V, uint8_t>) {
    std::vector<uint8_t> out(n->nbytes());
    check_quantized_access("get", n, out.size(), out.size());
    if (!out.empty()) n->buffer->get(n, out.data(), 0, out.size());
    return out;
  } else {
    fail("get", "tensor ", n->label(), " is ", dtype_name(n->dtype),
         ": use float (dequantized) or uint8_t (block bytes)");
  }
}

}  // namespace

template <class V>
void Tensor::set(std::span<const V> values) {
  if (is_quantized(node()->dtype)) return set_quantized<V>(node(), values);
  check_access("set", node(), values.size(), dtype_matches<V>(node()->dtype));
  if (values.empty()) return;  // an empty tensor: nothing to copy (and no null memcpy)
  const TensorNode* owner = node()->view_src ? node()->view_src : node();
  if (node()->is_contiguous()) {
    node()->buffer->set(node(), values.data(), 0, values.size() * sizeof(V));
  } else if (owner->buffer && owner->buffer->is_host()) {
    char* base = static_cast<char*>(node()->data);
    for_each_offset(
        node(), [&](int64_t off, int64_t i) { std::memcpy(base + off, &values[i], sizeof(V)); });
  } else {
    fail("set", "tensor ", label(), " is a non-contiguous view on a device buffer: set its source");
  }
}

template <class V>
std::vector<V> Tensor::get() const {
  if (is_quantized(node()->dtype)) return get_quantized<V>(node());
  std::vector<V> out(size_t(node()->numel()));
  check_access("get", node(), out.size(), dtype_matches<V>(node()->dtype));
  if (out.empty()) return out;
  if (node()->is_contiguous()) {
    node()->buffer->get(node(), out.data(), 0, out.size() * sizeof(V));
  } else if (node()->buffer && node()->buffer->is_host()) {
    const char* base = static_cast<const char*>(node()->data);
    for_each_offset(node(),
                    [&](int64_t off, int64_t i) { std::memcpy(&out[i], base + off, sizeof(V)); });
  } else {
    // A strided view in device memory: fetch the bytes it spans (strides are
    // never negative), then gather on the host.
    int64_t span = 0;
    for_each_offset(node(), [&](int64_t off, int64_t) {
      span = std::max<int64_t>(span, off + int64_t(sizeof(V)));
    });
    std::vector<char> bytes(static_cast<size_t>(span));
    node()->buffer->get(node(), bytes.data(), 0, bytes.size());
    for_each_offset(node(), [&](int64_t off, int64_t i) {
      std::memcpy(&out[i], bytes.data() + off, sizeof(V));
    });
  }
  return out;
}

float Tensor::item() const {
  if (numel() != 1)
    fail("item", "tensor ", label(), " ", shape().str(), " has ", numel(), " elements, not 1");
  switch (dtype()) {
    case DType::f32: return get<float>()[0];
    case DType::i32: return float(get<int32_t>()[0]);
    case DType::f16: return f16_to_f32(get<uint16_t>()[0]);
    case DType::bf16: return bf16_to_f32(get<uint16_t>()[0]);
    default: break;  // quantized: never one element, rows are whole blocks
  }
  return 0;
}

void Tensor::fill_zero() {
  if (!node()->data) fail("fill_zero", "tensor ", label(), " has no memory yet");
  if (!node()->is_contiguous()) fail("fill_zero", "tensor ", label(), " is not contiguous");
  node()->buffer->memset(node(), 0, 0, node()->nbytes());
}

template void Tensor::set<float>(std::span<const float>);
template void Tensor::set<int32_t>(std::span<const int32_t>);
template void Tensor::set<uint16_t>(std::span<const uint16_t>);
template std::vector<float> Tensor::get<float>() const;
template std::vector<int32_t> Tensor::get<int32_t>() const;
template std::vector<uint16_t> Tensor::get<uint16_t>() const;
template void Tensor::set<uint8_t>(std::span<const uint8_t>);
template std::vector<uint8_t> Tensor::get<uint8_t>() const;

}  // namespace kiln
