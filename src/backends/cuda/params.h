// The op parameters the CUDA launchers read, by meaning, from the ops' typed
// parameter structs (kiln/ext/op_params.h). The fused ops' launchers (norm.cu,
// attention.cu, matmul's MatmulParams in supports.cpp) read their whole struct
// (op_params<LayerNormParams> etc.) where they use most of its fields.
#pragma once
#include <cstdint>

#include "kiln/ext/op_params.h"
#include "kiln/tensor.h"

namespace kiln::cuda::prm {

inline int64_t axis(const TensorNode* n) {
  return op_params<ReduceParams>(*n).axis;
}  // SUM MAX ARGMAX; -1: all
inline int cmp_mode(const TensorNode* n) {
  return int(op_params<Op::COMPARE>(*n).mode);
}  // 0 eq .. 5 ge
inline float fill_value(const TensorNode* n) { return op_params<Op::FULL>(*n).value; }
inline float pad_value(const TensorNode* n) { return op_params<Op::PAD>(*n).value; }
inline int64_t pad_before(const TensorNode* n, int d) {
  return op_params<Op::PAD>(*n).before[size_t(d)];
}
inline uint64_t rand_seed(const TensorNode* n) {
  return uint64_t(op_params<Op::RAND_MASK>(*n).seed);
}
inline float rand_p(const TensorNode* n) { return op_params<Op::RAND_MASK>(*n).keep; }
inline float pow_exp(const TensorNode* n) { return op_params<Op::POW>(*n).exponent; }
inline float scale_mul(const TensorNode* n) { return op_params<Op::SCALE>(*n).mul; }  // mul*x + add
inline float scale_add(const TensorNode* n) { return op_params<Op::SCALE>(*n).add; }
inline float clamp_lo(const TensorNode* n) { return op_params<Op::CLAMP>(*n).lo; }
inline float clamp_hi(const TensorNode* n) { return op_params<Op::CLAMP>(*n).hi; }
inline float leaky_slope(const TensorNode* n) { return op_params<Op::LEAKY_RELU>(*n).slope; }
inline float softmax_scale(const TensorNode* n) { return op_params<SoftmaxParams>(*n).scale; }
inline bool softmax_causal(const TensorNode* n) { return op_params<SoftmaxParams>(*n).causal; }
inline int64_t one_hot_classes(const TensorNode* n) { return op_params<Op::ONE_HOT>(*n).classes; }
inline const char* one_hot_op_name(const TensorNode* n) {
  return op_params<Op::ONE_HOT>(*n).for_cross_entropy ? "cross_entropy" : "one_hot";
}
// ignore_index or per-row weights (CrossEntropyParams::masked): the CUDA loss
// kernels implement the plain mean only and decline these nodes.
inline bool cross_entropy_masked(const TensorNode* n) {
  return op_params<CrossEntropyParams>(*n).masked();
}
inline int concat_dim(const TensorNode* n) { return int(op_params<Op::CONCAT>(*n).dim); }

// IM2COL/COL2IM/CONV2D* (dilated) and pooling (dilation 1).
struct Window {
  int64_t kh, kw, sh, sw, ph, pw, dh = 1, dw = 1;
};
inline Window window(const TensorNode* n, bool dilated) {
  if (dilated) {
    const Conv2dParams p = op_params<Conv2dParams>(*n);
    return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw, p.dh, p.dw};
  }
  const Pool2dParams p = op_params<Pool2dParams>(*n);
  return {p.kh, p.kw, p.sh, p.sw, p.ph, p.pw};
}

}  // namespace kiln::cuda::prm
