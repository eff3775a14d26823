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

// supports.cpp
bool supported(const TensorNode* n);
bool checks_indices(Op op);  // ONE_HOT, GET_ROWS, SCATTER_ADD_ROWS
size_t workspace_bytes(const TensorNode* n);
void run_node(TensorNode* n, const Launch& L);  // dispatch by op

// elementwise.cu
void copy_ops(TensorNode* dst, const Launch& L);    // CPY FILL RAND_MASK
void binary_ops(TensorNode* dst, const Launch& L);  // ADD SUB MUL DIV CMP WHERE ACCUMULATE
void unary_ops(TensorNode* dst, const Launch& L);   // NEG ... SOFTPLUS
void optim_ops(TensorNode* dst, const Launch& L);   // OPT_STEP_ADAMW OPT_STEP_SGD
// reduce.cu
void reduce_ops(TensorNode* dst, const Launch& L);   // SUM MAX ARGMAX COUNT_EQUAL
void softmax_ops(TensorNode* dst, const Launch& L);  // SOFTMAX LOG_SOFTMAX
size_t reduce_workspace(const TensorNode* dst);      // full SUM/MAX, COUNT_EQUAL
// index.cu
void index_ops(TensorNode* dst, const Launch& L);   // ONE_HOT GET_ROWS SCATTER_ADD_ROWS
size_t index_workspace(const TensorNode* dst);      // SCATTER_ADD_ROWS's sort
void layout_ops(TensorNode* dst, const Launch& L);  // CONCAT PAD REPEAT REPEAT_BACK
// conv.cu
void conv_ops(TensorNode* dst, const Launch& L);  // IM2COL COL2IM CONV2D* *POOL2D*
size_t conv_workspace(const TensorNode* dst);
// matmul.cu
void matmul_op(TensorNode* dst, const Launch& L);
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
