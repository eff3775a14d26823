// Internal helpers for op builders (src/core/ops/*.cpp, and the optimizer-step
// builders of src/opt): node creation and the checks that give "[op] ..." errors.
#pragma once
#include <initializer_list>

#include "kiln/context.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln::detail {

// A new contiguous node of `op` in the first src's context.
TensorNode* new_op(Op op, DType t, const Shape& s, std::initializer_list<TensorNode*> srcs,
                   const OpParamBytes& p = {});
// The same with the op's parameter struct (kiln/ext/op_params.h).
template <class P>
TensorNode* new_op(Op op, DType t, const Shape& s, std::initializer_list<TensorNode*> srcs,
                   const P& p) {
  KILN_ASSERT(op_uses_params<P>(op));
  return new_op(op, t, s, srcs, pack_params(p));
}

// Checks (each throws kiln::Error starting with "[op] ").
void check_defined(const char* op, std::initializer_list<Tensor> ts);
void check_dtype(const char* op, const char* what, Tensor t, DType want);
void check_float32(const char* op, const char* what, Tensor t);  // f32 only
void check_same_ctx(const char* op, std::initializer_list<Tensor> ts);
// Normalises a possibly negative axis for an ndim-dimensional tensor.
int norm_axis(const char* op, int axis, int ndim);
// Numpy broadcast of two shapes, or a kiln::Error naming both tensors.
Shape broadcast_shapes(const char* op, const Shape& a, const Shape& b);

// Bytes of a contiguous tensor of dtype t and shape s. Every tensor creation goes
// through it (Context::new_node, so leaves, ops and views alike): a negative dim,
// an element count or a byte size that does not fit in int64 is a kiln::Error
// "[op] tensor 'name' [shape] ...", so strides and offsets derived from the shape
// cannot wrap either.
size_t checked_nbytes(const char* op, const std::string& name, DType t, const Shape& s);

// Row-major contiguous byte strides for a shape.
std::array<int64_t, kMaxDims> contiguous_strides(const Shape& s, size_t elem_size);
// Strides of a contiguous tensor of dtype t: for a quantized dtype the last dim
// steps one block and the one before it one row (ggml's nb[0], nb[1]).
std::array<int64_t, kMaxDims> contiguous_strides(const Shape& s, DType t);

}  // namespace kiln::detail
