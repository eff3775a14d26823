// The op-test reference: evaluates any kiln graph node by node in double
// precision, with naive loops written from each op's definition in kiln/ops.def
// (never from the optimised kernels). Every op in ops.def needs a `ref_<ENUM>`
// function (declared below from the X-macro; a missing one is a link error).
//
// Values are logical: each node's value is stored row-major over its shape, so a
// view's value is a gathered copy computed from the view's params (strides and
// offsets never matter here). The reference also derives each output shape from
// the op's definition and throws RefError when the node's shape disagrees.
#pragma once
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/ext/op_params.h"
#include "kiln/tensor.h"

namespace kiln::test {

// A tensor's logical values, row-major over `shape`.
struct RefValue {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<double> v;
  int64_t numel() const { return shape.numel(); }
};

// A graph the reference cannot evaluate, or a node whose shape/dtype disagrees
// with the op's definition.
class RefError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

using RefValues = std::unordered_map<const TensorNode*, RefValue>;

// Evaluates `nodes` in order. Every source must already have a value in `vals`
// (leaves are given by the caller) or be an earlier node. ALIAS ops (ACCUMULATE,
// optimizer steps) also write their result into src0's value, as the in-place
// kernel does, and optimizer steps their new state into the state tensors.
void ref_eval(std::span<TensorNode* const> nodes, RefValues& vals);
// Evaluates one node from its sources' values (already in `vals`); in-place
// writes to other tensors go to `writes` when given.
RefValue ref_eval_node(const TensorNode* node, const RefValues& vals,
                       std::vector<std::pair<const TensorNode*, RefValue>>* writes = nullptr);

// What one op's reference gets.
struct RefArgs {
  const TensorNode* node = nullptr;
  const RefValue* src[kMaxSrc] = {};
  int n_src = 0;
  const RefValue& in(int i) const;  // throws RefError when src i is missing
  template <class P>
  P params() const {  // the node's parameters (kiln/ext/op_params.h)
    return op_params<P>(*node);
  }
  // Other tensors an op rewrites in place (optimizer state): applied by ref_eval
  // after the node's own value.
  mutable std::vector<std::pair<const TensorNode*, RefValue>> writes;
};

#define KILN_OP(e, family, kind, inplace, grad) RefValue ref_##e(const RefArgs& a);
#include "kiln/ops.def"
#undef KILN_OP

// ---- helpers for the ref_* functions (reference.cpp) ----

// A zero value with the node's dtype and shape.
RefValue ref_out(const TensorNode* node);
RefValue ref_out(const TensorNode* node, const Shape& expected);  // + shape check
// Throws RefError "[op] ... shape is X, by definition it is Y".
void ref_check_shape(const TensorNode* node, const Shape& expected);
[[noreturn]] void ref_fail(const TensorNode* node, const std::string& msg);

// Row-major multi-index iteration over a shape: `Index it(s); do {..} while (it.next());`
struct Index {
  explicit Index(const Shape& s) : shape(s) {}
  Shape shape;
  int64_t i[kMaxDims] = {};
  bool next();  // false after the last element (or right away for an empty shape)
};
int64_t ref_linear(const Shape& s, const int64_t* idx);  // idx has s.ndim() entries
// The value of v at the output index `out_idx` (out_nd dims) under numpy
// broadcasting (right-aligned; size-1 dims of v stretch).
double ref_bcast_at(const RefValue& v, const int64_t* out_idx, int out_nd);
// numpy broadcast of two shapes (throws RefError naming `node` when impossible).
Shape ref_bcast_shape(const TensorNode* node, const Shape& a, const Shape& b);
// Value as stored in a tensor of dtype t (f16/bf16 rounding, i32 truncation).
double ref_round_to(DType t, double x);
// Values of a q8_0 / q4_0 tensor (rows of k values) as stored: each row's f32
// values quantized with ggml's reference formulas, then dequantized (the
// formats are checked against ggml's own bytes in tests/core/test_quant.cpp).
void ref_round_rows_to(DType t, std::vector<double>& v, int64_t k);

}  // namespace kiln::test
