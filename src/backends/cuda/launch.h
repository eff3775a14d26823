// Internal to the CUDA backend: what a node's launcher gets, and the launchers
// of the kernel families (one .cu file each). Compiled by both g++ (backend,
// dispatch) and nvcc (kernels); needs the CUDA runtime and cuBLAS headers.
//
// Contract of a launcher (as the CPU kernels' in cpu/kernels/kernels.h): dst's
// sources have any byte strides (views, broadcasts); dst is contiguous unless it
// is an ALIAS op; every launch goes to L.stream and nothing synchronizes, so a
// node list can be captured into a CUDA graph. A launcher may use L.ws (its
// scratch, at least workspace_bytes(dst) bytes, shared by all nodes: the stream
// runs them one after the other). Index ops record the first bad position in
// *L.err (atomicMin; kNoError when all are good); the backend reads it back.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

inline constexpr unsigned long long kNoError = ~0ull;

struct Launch {
  cudaStream_t stream = nullptr;
  cublasHandle_t blas = nullptr;
  bool allow_tf32 = false;
  char* ws = nullptr;
  size_t ws_size = 0;
  unsigned long long* err = nullptr;  // this node's error slot (index ops only)
};

// Throws kiln::Error "[cuda] <what>: <error string>" unless e is cudaSuccess.
void check(cudaError_t e, const char* what);
void check_blas(cublasStatus_t s, const char* what);
// After a kernel launch: launch-configuration errors.
void check_launch(const char* kernel);

// supports.cpp: the op table of this backend, generated from ops.def.
bool supported(const TensorNode* n);
bool checks_indices(Op op);  // ONE_HOT, EMBEDDING, SCATTER_ADD_ROWS, CROSS_ENTROPY(_BACK)
size_t workspace_bytes(const TensorNode* n);
void run_node(TensorNode* n, const Launch& L);  // dispatch by op

// What the backend knows of one op: which nodes it runs (dtypes, layout), its
// launcher, its scratch need and whether it records index errors. An empty
// entry (no run): no CUDA kernel; the scheduler runs the op elsewhere.
struct OpKernel {
  bool (*supports)(const TensorNode*) = nullptr;
  void (*run)(TensorNode*, const Launch&) = nullptr;
  size_t (*workspace)(const TensorNode*) = nullptr;  // null: none
  bool checks_indices = false;
};

// Common support conditions.
inline bool is_4byte(DType t) { return t == DType::f32 || t == DType::i32; }
inline bool is_float(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
inline bool all_f32(const TensorNode* n) {
  if (n->dtype != DType::f32) return false;
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i] && n->src[i]->dtype != DType::f32) return false;
  return true;
}

// One function per op family of ops.def (its second column): <family>_kernel(op)
// is the entry of each op of the family, defined next to the family's kernels
// in <family>.cu. supports.cpp calls it for every op of ops.def
// (tests/ops/check_op_families.sh checks the files).
OpKernel copy_kernel(Op op);
OpKernel binary_kernel(Op op);
OpKernel unary_kernel(Op op);
OpKernel reduce_kernel(Op op);
OpKernel matmul_kernel(Op op);
OpKernel softmax_kernel(Op op);
OpKernel index_kernel(Op op);
OpKernel conv_kernel(Op op);
OpKernel pool_kernel(Op op);
OpKernel optim_kernel(Op op);
OpKernel norm_kernel(Op op);       // LAYER_NORM, RMS_NORM and their backward ops
OpKernel attention_kernel(Op op);  // ATTENTION, ATTENTION_BACK, ROPE, ROPE_BACK
OpKernel rope_kernel(Op op);       // ROPE, ROPE_BACK (attention_rope.cu; attention_kernel forwards)
OpKernel loss_kernel(Op op);       // CROSS_ENTROPY, CROSS_ENTROPY_BACK
// Views need no kernel (supported() accepts every view and leaf). An op whose
// entry is empty runs on the CPU backend through the scheduler (the graph
// splits around it).
inline OpKernel views_kernel(Op) { return {}; }

// The families' launchers (one per family, dispatching on dst->op).
void copy_ops(TensorNode* dst, const Launch& L);    // copy.cu
void binary_ops(TensorNode* dst, const Launch& L);  // binary.cu
void optim_ops(TensorNode* dst, const Launch& L);   // optim.cu
void reduce_ops(TensorNode* dst, const Launch& L);  // reduce.cu
size_t reduce_workspace(const TensorNode* dst);
void softmax_ops(TensorNode* dst, const Launch& L);  // softmax.cu
void index_ops(TensorNode* dst, const Launch& L);    // index.cu: ONE_HOT EMBEDDING SCATTER_ADD_ROWS
size_t index_workspace(const TensorNode* dst);       // index.cu: SCATTER_ADD_ROWS's sort
void layout_ops(TensorNode* dst, const Launch& L);   // index.cu: CONCAT PAD REPEAT REPEAT_BACK
void conv_ops(TensorNode* dst, const Launch& L);     // conv.cu
size_t conv_workspace(const TensorNode* dst);
void pool_ops(TensorNode* dst, const Launch& L);   // pool.cu
void matmul_op(TensorNode* dst, const Launch& L);  // matmul.cu
size_t matmul_workspace(const TensorNode* dst);

// Shared by conv.cu and matmul.cu: C = A @ B on cuBLAS, row-major views with
// element strides (rs, cs) per operand; one of each operand's strides must be 1
// (or its dim 1). Batch b reads A + b*sa, B + b*sb, writes C + b*sc (elements).
struct GemmView {
  const void* p;
  cudaDataType_t type;
  int64_t rs, cs, batch_stride;
};
void gemm(const Launch& L, int64_t M, int64_t N, int64_t K, int64_t batch, GemmView A, GemmView B,
          float* C, int64_t ldc, int64_t c_batch_stride, bool accumulate = false);
// True when (rs, cs) of a rows x cols matrix is a layout cuBLAS reads directly.
bool gemm_layout_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs);

}  // namespace kiln::cuda
