// MATMUL: dst [..., M, N] (f32) = src0 [..., M, K] @ src1 [..., K, N], batch
// dims broadcast (numpy), src0/src1 f32, f16 or bf16 with any strides; or src1
// a quantized matrix (any type of kiln/quant_types.def), W.T() or W, read as
// stored (qmatmul.h).
// MATMUL_ACC: the same product added into src0 in place (a gradient accumulator).
// A 2-D MATMUL may carry a bias src2 (f32, N contiguous floats; put there by
// Graph::fuse_matmul_bias, for the CPU kernels only): dst = a @ b + bias, the add done by
// the GEMM as it stores C, bit-identical to a separate ADD. A MATMUL whose dst
// is bf16 is a cast folded into it (Graph::fuse_bf16_casts, CPU only): the f32
// product rounded as stored (with 2-D factors, the dst may be a contiguous
// reshape of [M, N]), bit-identical to the separate COPY.
//
// Each batch is one cpu::gemm call on strided views (a transposed view is just
// rs = 1, so x.T() needs no copy). Small products, and batches that split evenly
// or are many, are dealt out whole to threads, each running gemm alone on a
// private ThreadCtx: no barrier per product (conv2d runs one small product per
// image). A few large products are computed by all threads together (gemm
// splits M/N tiles). gemm gives the same bits for any thread count, so the
// choice never changes the result.
#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/qmatmul.h"

namespace kiln::cpu {
namespace {

GemmType gemm_type(DType t) {
  switch (t) {
    case DType::f32: return GemmType::f32;
    case DType::f16: return GemmType::f16;
    case DType::bf16: return GemmType::bf16;
    default: break;
  }
  fail("matmul", "inputs must be f32, f16 or bf16, got ", dtype_name(t));
}

// Byte strides of src's batch dims seen at dst's nb batch dims (0 = broadcast).
Strides batch_strides(const TensorNode* src, const TensorNode* dst, int nb) {
  Strides st{};
  const int snb = src->shape.ndim() - 2;
  for (int d = 0; d < nb; ++d) {
    const int sd = d - (nb - snb);
    if (sd >= 0 && src->shape[sd] != 1) st[d] = src->stride[sd];
  }
  return st;
}

// A quantized weight b (matmul's builder checked: 2 dims, a f32 with contiguous
// rows): x @ W^T when b is W.T(), dy @ W when b is W (qmatmul.h); every thread
// takes part in each batch's product.
void matmul_quantized(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *a = dst->src[0], *b = dst->src[1];
  const int nd = dst->shape.ndim(), na = a->shape.ndim();
  const int64_t M = dst->shape[nd - 2];
  KILN_ASSERT(a->dtype == DType::f32 && b->shape.ndim() == 2 && a->stride[na - 1] == 4);
  QuantMatrix W;
  W.data = b->data;
  W.format = b->dtype;                    // qmatmul checks it is a type it reads
  const bool xwt = b->quant_axis() == 0;  // b [K, N] = W.T(): W is [N, K]
  W.rows = xwt ? b->shape[1] : b->shape[0];
  W.cols = xwt ? b->shape[0] : b->shape[1];
  W.row_stride = size_t(xwt ? b->stride[1] : b->stride[0]);
  const int64_t lda = M > 1 ? a->stride[na - 2] / 4 : W.cols;
  const int64_t ldc = M > 1 ? dst->stride[nd - 2] / 4 : dst->shape[nd - 1];
  const int nbd = nd - 2;
  Shape bs;
  for (int d = 0; d < nbd; ++d) bs.push_back(dst->shape[d]);
  Strides sd{};
  for (int d = 0; d < nbd; ++d) sd[d] = dst->stride[d];
  auto L = make_layout<2>(bs, {sd, batch_strides(a, dst, nbd)});
  if (M == 0) return;
  for_each_run(L, {(char*)dst->data, (char*)a->data}, 0, bs.numel(),
               [&](const Ptrs<2>& p, int64_t n, const Steps<2>& st) {
                 for (int64_t i = 0; i < n; ++i) {
                   const float* x = reinterpret_cast<const float*>(p[1] + i * st[1]);
                   float* y = reinterpret_cast<float*>(p[0] + i * st[0]);
                   if (xwt) qmatmul_xwt(W, x, lda, y, ldc, M, t);
                   else qmatmul_xw(W, x, lda, y, ldc, M, t);
                 }
               });
}

// Rows of x (at most) that x @ W^T computes as dot products with W's rows as
// stored (gemv.h) rather than through gemm: decoding's batch of sequences.
constexpr int64_t kGemvRows = 8;

// Work (multiply-adds) below which one thread does a whole batch by itself.
constexpr int64_t kSmallGemm = int64_t(48) * 48 * 48;

// dst (=, or += when `accumulate`) a @ b (+ bias, N floats, 2-D only); dst gives
// the shape, strides and memory.
void run_matmul(TensorNode* dst, const TensorNode* a, const TensorNode* b, bool accumulate,
                const float* bias, ThreadCtx& t) {
  // Factors read rounded to bf16 (a folded cast: MatmulParams).
  const uint8_t round = op_params<MatmulParams>(*dst).round_bf16;
  auto rounds = [&](const TensorNode* x, int bit) {
    return x->dtype == DType::f32 && (round >> bit & 1) != 0;
  };
  const int nd = dst->shape.ndim(), na = a->shape.ndim(), nb_ = b->shape.ndim();
  KILN_ASSERT(na >= 2 && nb_ >= 2);
  // A bf16 dst is a cast to bf16 folded into the product (Graph::fuse_bf16_casts):
  // C rounded as it is stored. With 2-D factors that dst may be any contiguous
  // shape of M x N elements (the cast was of a reshape of the product).
  const bool to_bf16 = dst->dtype == DType::bf16;
  const bool flat = to_bf16 && na == 2 && nb_ == 2 && nd != 2;
  KILN_ASSERT(flat || nd >= 2);
  KILN_ASSERT(!to_bf16 || (!accumulate && (!flat || dst->is_contiguous())));
  const int64_t M = flat ? a->shape[0] : dst->shape[nd - 2];
  const int64_t N = flat ? b->shape[1] : dst->shape[nd - 1];
  const int64_t K = a->shape[na - 1];
  const int64_t ec = int64_t(dst->elem_size());
  KILN_ASSERT(flat ? dst->numel() == M * N : dst->stride[nd - 1] == ec);
  const int64_t ea = int64_t(a->elem_size()), eb = int64_t(b->elem_size());

  GemmArgs g{};
  g.M = M, g.N = N, g.K = K;
  g.A = {nullptr, gemm_type(a->dtype), a->stride[na - 2] / ea, a->stride[na - 1] / ea,
         rounds(a, 0)};
  g.B = {nullptr, gemm_type(b->dtype), b->stride[nb_ - 2] / eb, b->stride[nb_ - 1] / eb,
         rounds(b, 1)};
  g.ldc = flat ? N : dst->stride[nd - 2] / ec;
  g.accumulate = accumulate;
  g.bias = bias;
  KILN_ASSERT(!bias || nd == 2 || flat);

  // Batch index space: dst's leading dims, with src0 / src1 / dst byte strides.
  const int nbd = flat ? 0 : nd - 2;
  Shape bs;
  for (int d = 0; d < nbd; ++d) bs.push_back(dst->shape[d]);
  Strides sd{};
  for (int d = 0; d < nbd; ++d) sd[d] = dst->stride[d];
  auto L = make_layout<3>(bs, {sd, batch_strides(a, dst, nbd), batch_strides(b, dst, nbd)});
  const int64_t nbatch = bs.numel();

  auto at = [&](const Ptrs<3>& p) {
    GemmArgs gi = g;
    if (to_bf16) gi.C_bf16 = (uint16_t*)p[0];
    else gi.C = (float*)p[0];
    gi.A.data = p[1];
    gi.B.data = p[2];
    return gi;
  };
  // Calls fn(ptrs) for batches [b0, b1).
  auto batches = [&](int64_t b0, int64_t b1, auto&& fn) {
    for_each_run(L, {(char*)dst->data, (char*)a->data, (char*)b->data}, b0, b1,
                 [&](const Ptrs<3>& p, int64_t n, const Steps<3>& st) {
                   for (int64_t i = 0; i < n; ++i)
                     fn(Ptrs<3>{p[0] + i * st[0], p[1] + i * st[1], p[2] + i * st[2]});
                 });
  };

  // A few rows times a transposed matrix (x @ W^T in decoding: one row per
  // sequence, batch 1 or a few sequences decoded together): dot products of
  // W's rows as stored with each row of x (gemv.h), W's rows split over the
  // threads, instead of packing all of W for a few rows. W is read from memory
  // once for all rows of x (gemv_rows_multi). A bf16 dst takes the same path
  // (f32 rows in scratch, then rounded): gemm would sum in another order, and
  // the result must be the f32 product's, rounded as the COPY it replaces
  // rounds it.
  if (M <= kGemvRows && N > 1 && K > 0 && g.A.cs == 1 && g.B.rs == 1) {
    const GemmOperand w{nullptr, g.B.type, g.B.cs, 1, g.B.round_bf16};
    const Range rows = split_range(N, t.ith, t.nth, 8);
    // Scratch: x as f32 (M x K floats) and, for a bf16 dst, the f32 rows (M x N).
    float* xs =
        static_cast<float*>(t.scratch(size_t(M * K + (to_bf16 ? M * N : 0)) * sizeof(float)));
    float* y32 = xs + M * K;
    batches(0, nbatch, [&](const Ptrs<3>& p) {
      GemmOperand xa{p[1], g.A.type, g.A.rs, 1, g.A.round_bf16};
      if (xa.round_bf16) xa = rounded_bf16_copy(xa, M, K, 0);
      const float* x[kGemvRows];
      for (int64_t m = 0; m < M; ++m) {
        if (xa.type == GemmType::f32) {
          x[m] = static_cast<const float*>(xa.data) + m * xa.rs;
          continue;
        }
        for (int64_t k = 0; k < K; ++k)
          xs[m * K + k] = gemm_detail::load_as_f32(xa.data, xa.type, m * xa.rs + k);
        x[m] = xs + m * K;
      }
      GemmOperand wb = w;
      wb.data = p[2];
      if (wb.round_bf16) wb = rounded_bf16_copy(wb, N, K, 1);
      float* y = to_bf16 ? y32 : reinterpret_cast<float*>(p[0]);
      const int64_t ldy = to_bf16 ? N : g.ldc;
      float* ys[kGemvRows];
      for (int64_t m = 0; m < M; ++m) ys[m] = y + m * ldy;
      if (M == 1) gemv_rows(wb, x[0], K, y, rows.begin, rows.end, accumulate);
      else gemv_rows_multi(wb, x, M, K, ys, rows.begin, rows.end, accumulate);
      for (int64_t m = 0; m < M; ++m) {
        float* ym = y + m * ldy;
        if (bias)
          for (int64_t j = rows.begin; j < rows.end; ++j) ym[j] += bias[j];
        if (to_bf16 && rows.end > rows.begin)
          f32_to_bf16_n(ym + rows.begin, reinterpret_cast<uint16_t*>(p[0]) + m * g.ldc + rows.begin,
                        rows.end - rows.begin);
      }
    });
    return;
  }

  const int64_t work = M * N * std::max<int64_t>(K, 1);
  const bool many = nbatch >= t.nth && (nbatch % t.nth == 0 || nbatch >= 8 * int64_t(t.nth));
  if (work < kSmallGemm || many) {
    // Small products: whole batches per thread, each on a private context.
    const int k = useful_threads(nbatch, t.nth, work);
    if (t.ith >= k) return;
    Range r = split_range(nbatch, t.ith, k);
    batches(r.begin, r.end, [&](const Ptrs<3>& p) { gemm_alone(at(p)); });
    return;
  }
  batches(0, nbatch, [&](const Ptrs<3>& p) { gemm(at(p), t); });
}

}  // namespace

void kernel_MATMUL(TensorNode* dst, ThreadCtx& t) {
  if (is_quantized(dst->src[1]->dtype)) return matmul_quantized(dst, t);
  const TensorNode* bias = dst->n_src > 2 ? dst->src[2] : nullptr;
  const TensorNode* b = dst->src[1];
  KILN_ASSERT(!bias || (bias->dtype == DType::f32 &&
                        bias->numel() == b->shape[b->shape.ndim() - 1] && bias->is_contiguous()));
  run_matmul(dst, dst->src[0], dst->src[1], false,
             bias ? static_cast<const float*>(bias->data) : nullptr, t);
}

// The accumulator (src0, which dst aliases) += src1 @ src2: the GEMM adds into C.
void kernel_MATMUL_ACC(TensorNode* dst, ThreadCtx& t) {
  run_matmul(dst, dst->src[1], dst->src[2], true, nullptr, t);
}

}  // namespace kiln::cpu
