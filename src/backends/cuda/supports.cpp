// What the CUDA backend runs (per op and dtype), each op's scratch needs, the
// dispatch to the kernel families, and CUDA/cuBLAS error checks.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "backends/cuda/cublas_api.h"
#include "backends/cuda/launch.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail("cuda", what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}

void check_blas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS)
    fail("cuda", what, ": ", cublas().status_name(s), " (", cublas().status_string(s), ")");
}

void check_launch(const char* kernel) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    fail("cuda", "launching the ", kernel, " kernel: ", cudaGetErrorName(e), " (",
         cudaGetErrorString(e), ")");
}

namespace {

bool all_f32(const TensorNode* n) {
  if (n->dtype != DType::f32) return false;
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i] && n->src[i]->dtype != DType::f32) return false;
  return true;
}
bool is_4byte(DType t) { return t == DType::f32 || t == DType::i32; }
bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

}  // namespace

bool supported(const TensorNode* n) {
  const OpKind kind = op_kind(n->op);
  if (kind == OpKind::LEAF || kind == OpKind::VIEW) return true;  // no kernel needed
  const TensorNode* s0 = n->n_src > 0 ? n->src[0] : nullptr;
  const TensorNode* s1 = n->n_src > 1 ? n->src[1] : nullptr;
  switch (n->op) {
    case Op::CPY:
    case Op::FILL: return true;
    case Op::RAND_MASK: return n->dtype == DType::f32 && (!s0 || s0->dtype == DType::i32);
    case Op::ADD:
    case Op::SUB:
    case Op::MUL:
    case Op::DIV:
    case Op::ACCUMULATE: return all_f32(n);
    case Op::CMP:
      return n->dtype == DType::f32 && s0 && s1 && s0->dtype == s1->dtype && is_4byte(s0->dtype);
    case Op::WHERE:
      return n->n_src == 3 && is_4byte(s0->dtype) && is_4byte(n->dtype) && s1->dtype == n->dtype &&
             n->src[2]->dtype == n->dtype;
    case Op::NEG:
    case Op::ABS:
    case Op::SIGN:
    case Op::SQR:
    case Op::SQRT:
    case Op::EXP:
    case Op::LOG:
    case Op::SIN:
    case Op::COS:
    case Op::POW:
    case Op::SCALE:
    case Op::CLAMP:
    case Op::RELU:
    case Op::LEAKY_RELU:
    case Op::GELU:
    case Op::GELU_ERF:
    case Op::ERF:
    case Op::SILU:
    case Op::SIGMOID:
    case Op::TANH:
    case Op::SOFTPLUS: return all_f32(n);
    case Op::SUM:
    case Op::MAX: return all_f32(n);
    case Op::ARGMAX: return n->dtype == DType::i32 && is_4byte(s0->dtype);
    case Op::COUNT_EQUAL: return n->dtype == DType::i32 && s1 && s0->dtype == s1->dtype;
    case Op::MATMUL:
      return n->dtype == DType::f32 && is_float(s0->dtype) && is_float(s1->dtype) &&
             n->shape.ndim() >= 2 && n->stride[size_t(n->shape.ndim() - 1)] == 4;
    case Op::SOFTMAX:
    case Op::LOG_SOFTMAX: return all_f32(n);
    case Op::ONE_HOT: return n->dtype == DType::f32 && s0->dtype == DType::i32;
    case Op::GET_ROWS:
      return s0->shape.ndim() == 2 && s1->dtype == DType::i32 && n->dtype == s0->dtype;
    case Op::SCATTER_ADD_ROWS:
      return n->dtype == DType::f32 && s0->dtype == DType::f32 && s1->dtype == DType::i32;
    case Op::CONCAT: return s0->dtype == n->dtype && s1->dtype == n->dtype;
    case Op::PAD:
    case Op::REPEAT: return s0->dtype == n->dtype;
    case Op::REPEAT_BACK:
    case Op::IM2COL:
    case Op::COL2IM:
    case Op::CONV2D:
    case Op::CONV2D_BACK_INPUT:
    case Op::CONV2D_BACK_WEIGHT:
    case Op::MAX_POOL2D:
    case Op::MAX_POOL2D_BACK:
    case Op::AVG_POOL2D:
    case Op::AVG_POOL2D_BACK:
    case Op::OPT_STEP_ADAMW:
    case Op::OPT_STEP_SGD: return all_f32(n);
    // Fused transformer ops: CPU kernels only so far; the scheduler runs them
    // on the CPU backend (their graphs split around them).
    case Op::LAYER_NORM:
    case Op::LAYER_NORM_BACK:
    case Op::LAYER_NORM_BACK_AFFINE:
    case Op::ATTENTION:
    case Op::ATTENTION_BACK:
    case Op::CROSS_ENTROPY:
    case Op::CROSS_ENTROPY_BACK: return false;
    default: return false;  // an op without a CUDA kernel (yet): the scheduler runs it elsewhere
  }
}

bool checks_indices(Op op) {
  return op == Op::ONE_HOT || op == Op::GET_ROWS || op == Op::SCATTER_ADD_ROWS;
}

size_t workspace_bytes(const TensorNode* n) {
  switch (n->op) {
    case Op::SUM:
    case Op::MAX:
    case Op::COUNT_EQUAL: return reduce_workspace(n);
    case Op::SCATTER_ADD_ROWS: return index_workspace(n);
    case Op::MATMUL: return matmul_workspace(n);
    case Op::CONV2D:
    case Op::CONV2D_BACK_INPUT:
    case Op::CONV2D_BACK_WEIGHT: return conv_workspace(n);
    default: return 0;
  }
}

void run_node(TensorNode* n, const Launch& L) {
  switch (n->op) {
    case Op::CPY:
    case Op::FILL:
    case Op::RAND_MASK: return copy_ops(n, L);
    case Op::ADD:
    case Op::SUB:
    case Op::MUL:
    case Op::DIV:
    case Op::CMP:
    case Op::WHERE:
    case Op::ACCUMULATE: return binary_ops(n, L);
    case Op::NEG:
    case Op::ABS:
    case Op::SIGN:
    case Op::SQR:
    case Op::SQRT:
    case Op::EXP:
    case Op::LOG:
    case Op::SIN:
    case Op::COS:
    case Op::POW:
    case Op::SCALE:
    case Op::CLAMP:
    case Op::RELU:
    case Op::LEAKY_RELU:
    case Op::GELU:
    case Op::GELU_ERF:
    case Op::ERF:
    case Op::SILU:
    case Op::SIGMOID:
    case Op::TANH:
    case Op::SOFTPLUS: return unary_ops(n, L);
    case Op::SUM:
    case Op::MAX:
    case Op::ARGMAX:
    case Op::COUNT_EQUAL: return reduce_ops(n, L);
    case Op::MATMUL: return matmul_op(n, L);
    case Op::SOFTMAX:
    case Op::LOG_SOFTMAX: return softmax_ops(n, L);
    case Op::ONE_HOT:
    case Op::GET_ROWS:
    case Op::SCATTER_ADD_ROWS: return index_ops(n, L);
    case Op::CONCAT:
    case Op::PAD:
    case Op::REPEAT:
    case Op::REPEAT_BACK: return layout_ops(n, L);
    case Op::IM2COL:
    case Op::COL2IM:
    case Op::CONV2D:
    case Op::CONV2D_BACK_INPUT:
    case Op::CONV2D_BACK_WEIGHT:
    case Op::MAX_POOL2D:
    case Op::MAX_POOL2D_BACK:
    case Op::AVG_POOL2D:
    case Op::AVG_POOL2D_BACK: return conv_ops(n, L);
    case Op::OPT_STEP_ADAMW:
    case Op::OPT_STEP_SGD: return optim_ops(n, L);
    default: fail("cuda", "no kernel for ", op_name(n->op));
  }
}

}  // namespace kiln::cuda
