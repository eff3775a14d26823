// TensorNode: the metadata behind a Tensor handle (extension API). Op builders,
// allocators, the scheduler and backend kernels read and write its fields;
// programs use the Tensor handle (kiln/tensor.h) and never need this header.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "kiln/tensor.h"

namespace kiln {
namespace detail {
// Raw parameter bytes of a node: written and read only as the op's struct from
// kiln/ext/op_params.h (op_params<Op::X>(node)), never by position.
struct OpParamBytes {
  alignas(8) unsigned char bytes[80] = {};
};

// Metadata of one tensor. Data-free until an allocator sets `data`. Internal: op
// builders, allocators, the scheduler and backend kernels read and write these
// fields; programs use the Tensor handle. (kiln::TensorNode names it for backend
// code, which takes nodes in its interface.)
struct TensorNode {
  int64_t id = 0;  // creation index inside its context
  DType dtype = DType::f32;
  Shape shape;
  std::array<int64_t, kMaxDims> stride{};  // byte strides per dim
  Op op = Op::NONE;
  OpParamBytes params;  // see kiln/ext/op_params.h
  std::array<TensorNode*, kMaxSrc> src{};
  int n_src = 0;
  TensorNode* view_src = nullptr;  // set for VIEW ops: memory owner (never itself a view)
  size_t view_offs = 0;            // byte offset inside view_src
  void* data = nullptr;
  Buffer* buffer = nullptr;
  uint32_t flags = 0;
  std::string name;
  Context* ctx = nullptr;

  int64_t numel() const { return shape.numel(); }
  size_t elem_size() const { return dtype_size(dtype); }  // one block's bytes when quantized
  bool is_view() const { return view_src != nullptr; }
  bool is_contiguous() const;
  // For a quantized tensor (or a view of one): the dim that runs along the
  // stored rows, in blocks (the last dim of the tensor that owns the memory,
  // moved by permutes). -1 for other dtypes.
  int quant_axis() const;
  // Bytes a freshly allocated, contiguous tensor of this shape needs.
  size_t nbytes() const { return size_t(numel() / dtype_block_elems(dtype)) * elem_size(); }
  // Byte offset of the element at a multi-index (idx has ndim entries).
  int64_t offset_of(const int64_t* idx) const;
  // How messages name a tensor: "#12 'fc1.weight'", or "#12" when unnamed
  // (the id tells unnamed tensors apart and matches Graph::dump()).
  std::string label() const;
};

}  // namespace detail
}  // namespace kiln
