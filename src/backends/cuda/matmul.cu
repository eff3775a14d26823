// MATMUL and MATMUL_ACC (beta = 1) on cuBLAS (cublasGemmStridedBatchedEx), and
// the GEMM helper conv.cu shares.
//
// kiln's matrices are row-major views with element strides (rs, cs); cuBLAS is
// column-major. C = A @ B (row-major, M x N) is computed as C^T = B^T @ A^T
// (column-major, N x M): a row-major operand (cs == 1) is, read column-major
// with ld = rs, already the transpose cuBLAS wants (CUBLAS_OP_N); a transposed
// view (rs == 1, x.T()) is read with ld = cs and CUBLAS_OP_T. So the views of
// matmul's backward (a.T() @ dC, dC @ b.T()) are read in place, never copied.
// An operand whose layout cuBLAS cannot read is first gathered into a dense
// copy in the workspace (in its own dtype); with mixed input dtypes (cuBLAS
// wants one input type) the non-f32 operands are gathered into f32 copies
// (matmul_prep in gemm_plan.h decides, tested without a device). Batch dims (numpy broadcast,
// stride 0 for a broadcast operand) are merged where all three operands allow; the last merged
// batch dim is cuBLAS's batch, outer ones (rare broadcast patterns) loop.
//
// Precision: f32 inputs use CUBLAS_COMPUTE_32F (no TF32) unless the backend was
// made with allow_tf32; f16/bf16 inputs accumulate in f32 (CUBLAS_COMPUTE_32F,
// C f32). cuBLAS gives the same bits run to run on one GPU model and library
// version (its documented reproducibility; the backend sets a fixed workspace
// and one stream).
#include <climits>

#include "backends/cuda/common.cuh"
#include "backends/cuda/cublas_api.h"
#include "backends/cuda/gemm_plan.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {
namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::f16: return CUDA_R_16F;
    case DType::bf16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

__global__ void k_zero_rows(float* c, int64_t rows, int64_t cols, int64_t ldc) {
  KILN_GRID_LOOP(i, rows * cols) c[(i / cols) * ldc + i % cols] = 0.0f;
}

// Batch dims of dst (nb of them) with each operand's element stride (0 when
// broadcast), merged where every operand is contiguous across them.
struct Batch {
  int n = 0;
  int64_t size[kMaxDims] = {};
  int64_t sa[kMaxDims] = {}, sb[kMaxDims] = {}, sc[kMaxDims] = {};
};
Batch batch_dims(const TensorNode* dst, const TensorNode* a, const TensorNode* b,
                 const int64_t* a_st, const int64_t* b_st) {
  const int nb = dst->shape.ndim() - 2;
  Batch r;
  for (int d = 0; d < nb; ++d) {
    const int64_t size = dst->shape[d];
    if (size == 1) continue;
    auto stride_of = [&](const TensorNode* t, const int64_t* st) -> int64_t {
      const int sd = d - (nb - (t->shape.ndim() - 2));
      return sd >= 0 && t->shape[sd] != 1 ? st[sd] : 0;
    };
    const int64_t sa = stride_of(a, a_st), sb = stride_of(b, b_st), sc = dst->stride[size_t(d)] / 4;
    if (r.n > 0 && r.sa[r.n - 1] == sa * size && r.sb[r.n - 1] == sb * size &&
        r.sc[r.n - 1] == sc * size) {
      // the previous (outer) dim continues this one: merge
      r.size[r.n - 1] *= size;
      r.sa[r.n - 1] = sa;
      r.sb[r.n - 1] = sb;
      r.sc[r.n - 1] = sc;
      continue;
    }
    r.size[r.n] = size;
    r.sa[r.n] = sa;
    r.sb[r.n] = sb;
    r.sc[r.n] = sc;
    ++r.n;
  }
  return r;
}

size_t esize(cudaDataType_t t) { return t == CUDA_R_32F ? 4 : 2; }

}  // namespace

bool gemm_layout_ok(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  return gemm_layout_readable(rows, cols, rs, cs);
}

void gemm(const Launch& L, int64_t M, int64_t N, int64_t K, int64_t batch, GemmView A, GemmView B,
          float* C, int64_t ldc, int64_t c_batch_stride, bool accumulate) {
  if (M == 0 || N == 0 || batch == 0) return;
  if (M > INT_MAX || N > INT_MAX || K > INT_MAX || batch > INT_MAX || ldc > INT_MAX)
    fail("matmul", "sizes beyond cuBLAS's int range: M ", M, " N ", N, " K ", K, " batch ", batch);
  if (K == 0) {  // empty sum: C = 0 (or unchanged when accumulating)
    if (accumulate) return;
    for (int64_t b = 0; b < batch; ++b) {
      k_zero_rows<<<grid_for(M * N), kThreads, 0, L.stream>>>(C + b * c_batch_stride, M, N, ldc);
      check_launch("matmul");
    }
    return;
  }
  GemmRead ra, rb;
  if (!gemm_read(M, K, A.rs, A.cs, &ra) || !gemm_read(K, N, B.rs, B.cs, &rb))
    fail("cuda", "gemm operand layout not readable by cuBLAS (internal error)");
  if (A.type != B.type) fail("cuda", "gemm operands of different types (internal error)");
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  const cublasComputeType_t ct =
      A.type == CUDA_R_32F && L.allow_tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  const cublasOperation_t opa = ra.transpose ? CUBLAS_OP_T : CUBLAS_OP_N,
                          opb = rb.transpose ? CUBLAS_OP_T : CUBLAS_OP_N;
  // C^T [N, M] = op(B) [N, K] @ op(A) [K, M], column-major.
  check_blas(cublas().gemm_strided_batched_ex(
                 L.blas, opb, opa, int(N), int(M), int(K), &alpha, B.p, B.type, int(rb.ld),
                 B.batch_stride, A.p, A.type, int(ra.ld), A.batch_stride, &beta, C, CUDA_R_32F,
                 int(ldc), c_batch_stride, int(batch), ct, CUBLAS_GEMM_DEFAULT),
             "cublasGemmStridedBatchedEx");
}

namespace {

// cuBLAS reads the operand in place: its matrices (gemm_read) and its batch
// dims (one stride, batch_dims_one_run).
bool readable(const TensorNode* t) {
  const int nd = t->shape.ndim();
  const int64_t es = int64_t(t->elem_size());
  int64_t st[kMaxDims] = {};
  for (int d = 0; d < nd; ++d) {
    if (t->stride[size_t(d)] % es != 0) return false;
    st[d] = t->stride[size_t(d)] / es;
  }
  return gemm_layout_readable(t->shape[nd - 2], t->shape[nd - 1], st[nd - 2], st[nd - 1]) &&
         batch_dims_one_run(nd, t->shape.begin(), st);
}

// The product's operands: MATMUL's src0 and src1, MATMUL_ACC's src1 and src2
// (its src0 is the accumulator C, which dst aliases).
const TensorNode* operand(const TensorNode* dst, int i) {
  return dst->src[dst->op == Op::MATMUL_ACC ? i + 1 : i];
}

MatmulPrep prep_of(const TensorNode* dst) {
  const TensorNode *a = operand(dst, 0), *b = operand(dst, 1);
  return matmul_prep(a->dtype, readable(a), b->dtype, readable(b));
}

// Bytes of t's copy after p, rounded up so that the next copy stays aligned.
size_t copy_bytes(const TensorNode* t, Prep p) {
  if (p == Prep::none) return 0;
  const size_t es = p == Prep::to_f32 ? 4 : t->elem_size();
  return (size_t(t->numel()) * es + 255) / 256 * 256;
}

}  // namespace

size_t matmul_workspace(const TensorNode* dst) {
  const MatmulPrep p = prep_of(dst);
  return copy_bytes(operand(dst, 0), p.a) + copy_bytes(operand(dst, 1), p.b);
}

// MATMUL (C = A @ B) and MATMUL_ACC (C += A @ B, C the accumulator dst aliases).
void matmul_op(TensorNode* dst, const Launch& L) {
  const TensorNode *a = operand(dst, 0), *b = operand(dst, 1);
  const bool acc = dst->op == Op::MATMUL_ACC;
  const int nd = dst->shape.ndim();
  const int64_t M = dst->shape[nd - 2], N = dst->shape[nd - 1], K = a->shape[a->shape.ndim() - 1];
  if (dst->numel() == 0) return;
  const MatmulPrep plan = prep_of(dst);
  // Element strides of each operand (of its dense copy when it gets one).
  char* ws = L.ws;
  auto prepare = [&](const TensorNode* t, Prep p, int64_t* st) -> GemmView {
    const int tn = t->shape.ndim();
    if (p == Prep::none) {
      const int64_t es = int64_t(t->elem_size());
      for (int d = 0; d < tn; ++d) st[d] = t->stride[size_t(d)] / es;
      return {t->data, cuda_type(t->dtype), st[tn - 2], st[tn - 1], 0};
    }
    if (p == Prep::to_f32)
      gather_f32(static_cast<const char*>(t->data), t->dtype, idx_of(t), t->numel(),
                 reinterpret_cast<float*>(ws), L);
    else gather_dense(static_cast<const char*>(t->data), t->dtype, idx_of(t), t->shape, ws, L);
    int64_t run = 1;  // dense strides of the gathered copy
    for (int d = tn - 1; d >= 0; --d) {
      st[d] = run;
      run *= t->shape[d];
    }
    GemmView v{ws, cuda_type(prepared_dtype(t->dtype, p)), st[tn - 2], st[tn - 1], 0};
    ws += copy_bytes(t, p);
    return v;
  };
  int64_t sta[kMaxDims] = {}, stb[kMaxDims] = {};
  GemmView A = prepare(a, plan.a, sta), B = prepare(b, plan.b, stb);
  const Batch bt = batch_dims(dst, a, b, sta, stb);
  float* C = static_cast<float*>(dst->data);
  const int64_t ldc = M > 1 ? dst->stride[size_t(nd - 2)] / 4 : N;
  if (bt.n == 0) return gemm(L, M, N, K, 1, A, B, C, ldc, 0, acc);
  // cuBLAS's batch = the innermost merged dim; outer ones loop.
  const int last = bt.n - 1;
  int64_t outer = 1;
  for (int d = 0; d < last; ++d) outer *= bt.size[d];
  const size_t ea = esize(A.type), eb = esize(B.type);
  for (int64_t o = 0; o < outer; ++o) {
    int64_t rem = o, oa = 0, ob = 0, oc = 0;
    for (int d = last - 1; d >= 0; --d) {
      const int64_t i = rem % bt.size[d];
      rem /= bt.size[d];
      oa += i * bt.sa[d];
      ob += i * bt.sb[d];
      oc += i * bt.sc[d];
    }
    GemmView Ai = A, Bi = B;
    Ai.p = static_cast<const char*>(A.p) + oa * int64_t(ea);
    Bi.p = static_cast<const char*>(B.p) + ob * int64_t(eb);
    Ai.batch_stride = bt.sa[last];
    Bi.batch_stride = bt.sb[last];
    gemm(L, M, N, K, bt.size[last], Ai, Bi, C + oc, ldc, bt.sc[last], acc);
  }
}

OpKernel matmul_kernel(Op op) {
  if (op != Op::MATMUL && op != Op::MATMUL_ACC) return {};
  return {[](const TensorNode* n) {
            // A MATMUL with a third source carries a fused bias (Graph::fuse_matmul_bias):
            // left to the CPU kernel.
            if (n->op == Op::MATMUL && n->n_src != 2) return false;
            return n->dtype == DType::f32 && is_float(operand(n, 0)->dtype) &&
                   is_float(operand(n, 1)->dtype) && n->shape.ndim() >= 2 &&
                   n->stride[size_t(n->shape.ndim() - 1)] == 4;
          },
          matmul_op, matmul_workspace};
}

}  // namespace kiln::cuda
