// matmul: a @ b with broadcast batch dims; f32/f16/bf16 inputs, f32 output.
#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/ops.h"

namespace kiln {

namespace {

// x.to(bf16); but a permuted view of a contiguous tensor (w.T()) is cast through
// its source and viewed again: a contiguous conversion instead of a strided
// one, and the GEMM reads the permuted bf16 view in place.
Tensor to_bf16(Tensor x) {
  detail::TensorNode* n = x.node();
  if (n->op != Op::PERMUTE || !n->src[0]->is_contiguous()) return x.to(bf16);
  const auto& ax = op_params<Op::PERMUTE>(*n).axes;
  const Tensor s = Tensor(n->src[0]).to(bf16);
  switch (x.ndim()) {
    case 2: return s.permute({int(ax[0]), int(ax[1])});
    case 3: return s.permute({int(ax[0]), int(ax[1]), int(ax[2])});
    case 4: return s.permute({int(ax[0]), int(ax[1]), int(ax[2]), int(ax[3])});
    default: return x.to(bf16);
  }
}

// matmul with a quantized weight b: W.T() (x @ W^T, a Linear's forward) or W
// itself (dy @ W, its backward with respect to x). The CPU kernel reads W's
// blocks as stored; x is f32 with contiguous rows.
Tensor matmul_quantized(Tensor a, Tensor b, Shape s) {
  if (b.ndim() != 2)
    fail("matmul", "the quantized weight b ", b.label(), " ", b.shape().str(), " is ",
         dtype_name(b.dtype()), ": it must be a matrix (2 dims), batches broadcast over a");
  if (!quant_type(b.dtype()).matmul_reads)
    fail("matmul", "the quantized weight b ", b.label(), " ", b.shape().str(), " is ",
         dtype_name(b.dtype()), ", which matmul does not read as stored yet (",
         "kiln/quant_types.def): dequantize it to f32 or quantize it to a type it reads");
  if (a.dtype() != f32) a = a.to(f32);
  // The kernel reads x's rows whole and one after another: unit column stride
  // and rows at least K floats apart (an expanded x has row stride 0).
  const int64_t k = a.size(-1);
  const auto& st = a.node()->stride;
  if (st[size_t(a.ndim() - 1)] != 4 || (a.size(-2) > 1 && st[size_t(a.ndim() - 2)] < 4 * k))
    a = a.contiguous();
  return Tensor(detail::new_op(Op::MATMUL, f32, s, {a.node(), b.node()}));
}

}  // namespace

Tensor matmul(Tensor a, Tensor b) {
  detail::check_defined("matmul", {a, b});
  detail::check_same_ctx("matmul", {a, b});
  for (Tensor t : {a, b})
    if (t.dtype() == i32)
      fail("matmul", "inputs must be f32, f16 or bf16, but ", t == a ? "a" : "b", " ",
           t.shape().str(), " is i32");
  if (a.ndim() < 2 || b.ndim() < 2)
    fail("matmul", "a is ", a.shape().str(), " and b is ", b.shape().str(),
         ": both need at least 2 dimensions");
  const int64_t M = a.size(-2), K = a.size(-1), K2 = b.size(-2), N = b.size(-1);
  if (K != K2)
    fail("matmul", "a is ", a.shape().str(), " but b is ", b.shape().str(), ": a's last dim (", K,
         ") must equal b's second-to-last (", K2, ")");
  Shape ba, bb;
  for (int d = 0; d < a.ndim() - 2; ++d) ba.push_back(a.shape()[d]);
  for (int d = 0; d < b.ndim() - 2; ++d) bb.push_back(b.shape()[d]);
  Shape s;
  try {
    s = detail::broadcast_shapes("matmul", ba, bb);
  } catch (const Error&) {
    fail("matmul", "a is ", a.shape().str(), " and b is ", b.shape().str(),
         ": batch dims cannot be broadcast together");
  }
  s.push_back(M);
  s.push_back(N);
  if (is_quantized(a.dtype()))
    fail("matmul", "a ", a.label(), " ", a.shape().str(), " is ", dtype_name(a.dtype()),
         ": a quantized tensor is only the second operand, the weight (matmul(x, w.T()) or "
         "matmul(dy, w))");
  if (is_quantized(b.dtype())) return matmul_quantized(a, b, s);
  // The context's precision policy: f32 operands cast to bf16 (f32 accumulation).
  if (a.node()->ctx->matmul_precision() == bf16) {
    if (a.dtype() == f32) a = to_bf16(a);
    if (b.dtype() == f32) b = to_bf16(b);
  }
  return Tensor(detail::new_op(Op::MATMUL, f32, s, {a.node(), b.node()}));
}

namespace detail {

void backward_MATMUL(GradCtx& g) {
  // dA = dC @ B^T, dB = A^T @ dC (transposed views: no copies), summed over
  // broadcast batch dims.
  const Tensor a = g.src(0), b = g.src(1);
  if (is_quantized(b.dtype()) && g.needs(1))
    fail("matmul", "the quantized weight ", b.label(), " ", b.shape().str(), " is ",
         dtype_name(b.dtype()), " and gets no gradient: it must be frozen");
  // A cast of a reshape of the product folded in (Graph::fuse_bf16_casts): the
  // node holds [M, N] as another shape of 2-D factors' product.
  Tensor gc = g.grad();
  if (a.ndim() == 2 && b.ndim() == 2 && gc.ndim() != 2) gc = gc.reshape({a.size(0), b.size(1)});
  // A fused bias (src2, Graph::fuse_matmul_bias): its gradient as ADD's rule gives it.
  if (g.n_src() > 2 && g.needs(2)) g.add(2, sum_to(gc, g.src(2).shape()));
  // Under a bf16 policy both products would cast dC: cast it once here.
  if (gc.node()->ctx->matmul_precision() == bf16 && gc.dtype() == f32 && g.needs(0) && g.needs(1) &&
      !is_quantized(b.dtype()))
    gc = gc.to(bf16);
  if (g.needs(0)) {
    Tensor ga = matmul(gc, b.T());
    g.add(0, sum_to(ga, a.shape()));
  }
  if (g.needs(1)) {
    Tensor gb = matmul(a.T(), gc);
    g.add(1, sum_to(gb, b.shape()));
  }
}

// A param's gradient g added into its accumulator acc. A gradient that is a 2-D
// product (a weight's dW = x^T dY, or its transpose W^T's) is added by the GEMM
// itself (MATMUL_ACC, C += A @ B), so it is never written to a temporary and
// read back; a transposed product is computed transposed, (A B)^T = B^T A^T, as
// views. `g_shared`: something else reads g's product, so it is computed anyway.
TensorNode* accumulate_grad(TensorNode* acc, Tensor g, bool g_shared) {
  TensorNode* mm = g.node();
  bool transposed = false;
  if (mm->op == Op::PERMUTE && mm->shape.ndim() == 2) {
    transposed = op_params<Op::PERMUTE>(*mm).axes[0] == 1;  // else the identity
    mm = mm->src[0];
  }
  const bool fusable = !g_shared && mm->op == Op::MATMUL && mm->shape.ndim() == 2 &&
                       mm->src[0]->shape.ndim() == 2 && mm->src[1]->shape.ndim() == 2 &&
                       !is_quantized(mm->src[1]->dtype);
  TensorNode* upd;
  if (fusable) {
    Tensor a(mm->src[0]), b(mm->src[1]);
    if (transposed) {
      const Tensor a0 = a;
      a = b.T();
      b = a0.T();
    }
    KILN_ASSERT(a.size(0) == acc->shape[0] && b.size(1) == acc->shape[1]);
    upd = new_op(Op::MATMUL_ACC, f32, acc->shape, {acc, a.node(), b.node()});
  } else {
    if (g.dtype() != f32) g = g.to(f32);
    upd = new_op(Op::ACCUMULATE, f32, acc->shape, {acc, g.node()});
  }
  upd->view_src = acc;
  return upd;
}

}  // namespace detail
}  // namespace kiln
