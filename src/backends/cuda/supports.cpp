// The CUDA backend's op table, generated from ops.def: what it runs (per op and
// dtype), each op's scratch need and launcher, from the entries each kernel
// family declares next to its kernels (<family>_kernel in <family>.cu); and the
// CUDA/cuBLAS error checks.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "backends/cuda/cublas_api.h"
#include "backends/cuda/launch.h"
#include "kiln/error.h"
#include "kiln/ext/op_params.h"
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

// One entry per op of ops.def, from its family's <family>_kernel (launch.h).
struct Table {
  OpKernel k[size_t(Op::COUNT)];
  Table() {
#define KILN_OP(e, family, kind, inplace, grad) k[size_t(Op::e)] = family##_kernel(Op::e);
#include "kiln/ops.def"
#undef KILN_OP
  }
};

const OpKernel& kernel_of(Op op) {
  static const Table table;
  return table.k[size_t(op)];
}

}  // namespace

bool supported(const TensorNode* n) {
  const OpKind kind = op_kind(n->op);
  if (kind == OpKind::LEAF || kind == OpKind::VIEW) return true;  // no kernel needed
  // No CUDA kernel reads GGUF's quantized blocks yet: those nodes run on the CPU.
  if (is_quantized(n->dtype)) return false;
  for (int i = 0; i < n->n_src; ++i)
    if (n->src[i] && is_quantized(n->src[i]->dtype)) return false;
  // Factors read rounded to bf16 (Graph::fold_bf16_casts, CPU programs only).
  if ((n->op == Op::MATMUL || n->op == Op::MATMUL_ACC) &&
      op_params<MatmulParams>(*n).round_bf16 != 0)
    return false;
  const OpKernel& k = kernel_of(n->op);
  return k.run && k.supports && k.supports(n);
}

bool checks_indices(Op op) { return kernel_of(op).checks_indices; }

size_t workspace_bytes(const TensorNode* n) {
  const OpKernel& k = kernel_of(n->op);
  return k.workspace ? k.workspace(n) : 0;
}

void run_node(TensorNode* n, const Launch& L) {
  const OpKernel& k = kernel_of(n->op);
  if (!k.run) fail("cuda", "no kernel for ", op_name(n->op));
  k.run(n, L);
}

}  // namespace kiln::cuda
