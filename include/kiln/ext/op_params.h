// Named parameters of the ops in kiln/ops.def, for op builders, backward rules and
// backend kernels. Each op that has parameters declares its struct once below
// (KILN_OP_PARAMS); a node stores that struct in its parameter bytes. Readers name
// the fields (`op_params<Op::NARROW>(n).start`) instead of indexing raw slots, so
// a misspelt or misplaced parameter is a compile error, and asking a node for a
// struct its op does not declare stops the program (a library bug, not bad input).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/optim_hyper.h"
#include "kiln/tensor.h"

namespace kiln {

struct NoParams {};

// ---- views ----
struct PermuteParams {
  std::array<int64_t, kMaxDims> axes{};  // axes[d] = source axis of output axis d
};
struct NarrowParams {
  int64_t dim = 0, start = 0, length = 0;
};
// ---- copies and constants ----
struct FillParams {
  float value = 0;
};
struct RandMaskParams {
  int64_t seed = 0;  // element 0 of the optional i32 seed source is xor-ed into it
  float keep = 0;    // probability of a 1
};
// ---- elementwise ----
enum class CompareMode : int64_t { eq, ne, lt, le, gt, ge };
struct CompareParams {
  CompareMode mode = CompareMode::eq;
};
struct PowParams {
  float exponent = 1;
};
struct ScaleParams {
  float mul = 1, add = 0;  // mul*x + add
};
struct ClampParams {
  float lo = 0, hi = 0;
};
struct LeakyReluParams {
  float slope = 0;
};
// ---- reductions (SUM, MAX, ARGMAX) ----
struct ReduceParams {
  int64_t axis = -1;  // -1: every element (SUM and MAX only)
  bool keepdim = false;
};
struct TopkParams {  // TOPK
  int64_t k = 0;     // indices kept per row, 1..C
};
// ---- neural-net ----
struct SoftmaxParams {  // SOFTMAX and LOG_SOFTMAX
  float scale = 1;
  bool causal = false;
};
struct OneHotParams {
  int64_t classes = 0;
  bool for_cross_entropy = false;  // range errors name cross_entropy instead of one_hot
};
// CROSS_ENTROPY and CROSS_ENTROPY_BACK. ignore: a label equal to ignore_index
// counts for nothing (no loss, no gradient; PyTorch's ignore_index). has_weight:
// f32 per-row weights [N] are the last source. Either one makes the result the
// weighted mean over the counted rows, sum(w * loss) / sum(w), and 0 (gradient
// 0) when that denominator is 0; with neither it is the plain mean over N.
struct CrossEntropyParams {
  int32_t ignore_index = -100;
  bool ignore = false, has_weight = false;
  bool masked() const { return ignore || has_weight; }
};
struct ScatterAddRowsParams {
  int64_t rows = 0;
};
struct ConcatParams {
  int64_t dim = 0;
};
struct PadParams {
  std::array<int64_t, kMaxDims> before{}, after{};  // per dim
  float value = 0;
};
// LAYER_NORM and its backward ops: which optional sources follow x.
// has_residual (LAYER_NORM_BACK only): a last source added to dx, the other
// gradient it was summed with (Graph::fuse_norm_residual).
struct LayerNormParams {
  float eps = 1e-5f;
  bool has_weight = false, has_bias = false, has_residual = false;
};
// RMS_NORM and its backward ops: whether a weight follows x; has_residual as
// for LayerNormParams (RMS_NORM_BACK only).
struct RmsNormParams {
  float eps = 1e-6f;
  bool has_weight = false, has_residual = false;
};
// ATTENTION and ATTENTION_BACK.
struct AttentionParams {
  float scale = 1;
  bool causal = false;
  bool segmented = false;  // a source after v (ATTENTION) or dO (ATTENTION_BACK): i32 ids [S, T]
  // Dropout on the softmax weights (AttentionOptions::dropout): each kept with
  // probability keep (< 1) and scaled by 1 / keep; keep 1: no dropout. The
  // mask bit of (head h, query i, key j) is rng_uniform(seed, (h Tq + i) Tk + j)
  // < keep (kiln/ext/rng.h), the dropout op's mask of the [..., Tq, Tk]
  // weights; seeded: the last source is an i32 seed tensor, element 0 xor-ed
  // into seed at run time (as RAND_MASK's).
  float keep = 1;
  int64_t seed = 0;
  bool seeded = false;
};
// IM2COL, COL2IM and the CONV2D ops: kernel, stride, padding, dilation (height, width).
// MATMUL and MATMUL_ACC: a set bit means that f32 factor (bit 0 the left one,
// bit 1 the right one) is read rounded to bf16, as if cast first (a cast folded
// into the product by Graph::fold_bf16_casts; CPU programs only). 0: as stored.
struct MatmulParams {
  uint8_t round_bf16 = 0;
};
struct Conv2dParams {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
};
// The pooling ops (dilation 1).
struct Pool2dParams {
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
};

// ---- optimizer steps: no op parameters; their per-step values (AdamWHyper,
// SgdHyper) are user API, in kiln/optim_hyper.h ----

// Which struct each op keeps (NoParams unless listed).
template <Op>
struct OpParamsOf {
  using type = NoParams;
};
#define KILN_OP_PARAMS(e, T) \
  template <>                \
  struct OpParamsOf<Op::e> { \
    using type = T;          \
  };
KILN_OP_PARAMS(PERMUTE, PermuteParams)
KILN_OP_PARAMS(NARROW, NarrowParams)
KILN_OP_PARAMS(FULL, FillParams)
KILN_OP_PARAMS(RAND_MASK, RandMaskParams)
KILN_OP_PARAMS(COMPARE, CompareParams)
KILN_OP_PARAMS(POW, PowParams)
KILN_OP_PARAMS(SCALE, ScaleParams)
KILN_OP_PARAMS(CLAMP, ClampParams)
KILN_OP_PARAMS(LEAKY_RELU, LeakyReluParams)
KILN_OP_PARAMS(SUM, ReduceParams)
KILN_OP_PARAMS(MAX, ReduceParams)
KILN_OP_PARAMS(ARGMAX, ReduceParams)
KILN_OP_PARAMS(TOPK, TopkParams)
KILN_OP_PARAMS(SOFTMAX, SoftmaxParams)
KILN_OP_PARAMS(LOG_SOFTMAX, SoftmaxParams)
KILN_OP_PARAMS(ONE_HOT, OneHotParams)
KILN_OP_PARAMS(SCATTER_ADD_ROWS, ScatterAddRowsParams)
KILN_OP_PARAMS(CROSS_ENTROPY, CrossEntropyParams)
KILN_OP_PARAMS(CROSS_ENTROPY_BACK, CrossEntropyParams)
KILN_OP_PARAMS(CONCAT, ConcatParams)
KILN_OP_PARAMS(PAD, PadParams)
KILN_OP_PARAMS(LAYER_NORM, LayerNormParams)
KILN_OP_PARAMS(LAYER_NORM_BACK, LayerNormParams)
KILN_OP_PARAMS(LAYER_NORM_BACK_AFFINE, LayerNormParams)
KILN_OP_PARAMS(RMS_NORM, RmsNormParams)
KILN_OP_PARAMS(RMS_NORM_BACK, RmsNormParams)
KILN_OP_PARAMS(RMS_NORM_BACK_WEIGHT, RmsNormParams)
KILN_OP_PARAMS(ATTENTION, AttentionParams)
KILN_OP_PARAMS(ATTENTION_BACK, AttentionParams)
KILN_OP_PARAMS(MATMUL, MatmulParams)
KILN_OP_PARAMS(MATMUL_ACC, MatmulParams)
KILN_OP_PARAMS(IM2COL, Conv2dParams)
KILN_OP_PARAMS(COL2IM, Conv2dParams)
KILN_OP_PARAMS(CONV2D, Conv2dParams)
KILN_OP_PARAMS(CONV2D_BACK_INPUT, Conv2dParams)
KILN_OP_PARAMS(CONV2D_BACK_WEIGHT, Conv2dParams)
KILN_OP_PARAMS(MAX_POOL2D, Pool2dParams)
KILN_OP_PARAMS(MAX_POOL2D_BACK, Pool2dParams)
KILN_OP_PARAMS(AVG_POOL2D, Pool2dParams)
KILN_OP_PARAMS(AVG_POOL2D_BACK, Pool2dParams)
#undef KILN_OP_PARAMS

template <Op op>
using op_params_t = typename OpParamsOf<op>::type;

// Does `op` keep its parameters in a P? (Generated from ops.def.)
template <class P>
constexpr bool op_uses_params(Op op) {
  switch (op) {
#define KILN_OP(e, family, kind, inplace, grad) \
  case Op::e:                                   \
    return std::is_same_v<op_params_t<Op::e>, P>;
#include "kiln/ops.def"
#undef KILN_OP
    case Op::COUNT: break;
  }
  return false;
}

namespace detail {

template <class P>
OpParamBytes pack_params(const P& p) {
  static_assert(std::is_trivially_copyable_v<P>, "op parameters must be trivially copyable");
  static_assert(sizeof(P) <= sizeof(OpParamBytes::bytes), "op parameters do not fit a node");
  OpParamBytes b;
  // An empty struct (NoParams) still has one byte, of no particular value:
  // copied, it would become whatever the op's first parameter byte means.
  if constexpr (!std::is_empty_v<P>) std::memcpy(b.bytes, &p, sizeof(P));
  return b;
}

// Stores p as n's parameters; p must be the struct n's op declares.
template <class P>
void set_params(TensorNode& n, const P& p) {
  KILN_ASSERT(op_uses_params<P>(n.op));
  n.params = pack_params(p);
}

}  // namespace detail

// n's parameters as P, the struct its op declares (several ops may share one).
template <class P>
P op_params(const TensorNode& n) {
  KILN_ASSERT(op_uses_params<P>(n.op));
  P p;
  std::memcpy(&p, n.params.bytes, sizeof(P));
  return p;
}
template <Op op>
op_params_t<op> op_params(const TensorNode& n) {
  static_assert(!std::is_same_v<op_params_t<op>, NoParams>, "this op has no parameters");
  KILN_ASSERT(n.op == op);
  return op_params<op_params_t<op>>(n);
}

namespace detail {

Tensor make_op_bytes(Op op, DType t, const Shape& s, std::initializer_list<Tensor> srcs,
                     const OpParamBytes& p);

// Creates a node of `op` with the given sources, dtype, shape and parameters and
// no checks at all: for the library's own builders (optimizer steps) and tests that
// need a node the public builders refuse to make.
template <class P = NoParams>
Tensor make_op(Op op, DType t, const Shape& s, std::initializer_list<Tensor> srcs,
               const P& p = {}) {
  KILN_ASSERT((std::is_same_v<P, NoParams> || op_uses_params<P>(op)));
  return make_op_bytes(op, t, s, srcs, pack_params(p));
}

}  // namespace detail

}  // namespace kiln
