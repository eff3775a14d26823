// matmul: a @ b with broadcast batch dims; f32/f16/bf16 inputs, f32 output.
// expert_matmul: each token times its chosen experts' weights (mixture of
// experts), with EXPERT_MATMUL_BACK_WEIGHT for the weights' gradient.
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

namespace {

// x with unit last-dim stride, as the expert kernels read rows.
Tensor unit_rows(Tensor x) {
  return x.ndim() > 0 && x.node()->stride[size_t(x.ndim() - 1)] != 4 ? x.contiguous() : x;
}

// Checks x [N, K] or [N, k, K] against ids [N, k] and K; returns x as f32 with unit
// last-dim stride.
Tensor expert_rows(const char* name, const char* what, Tensor x, Tensor ids, int64_t K) {
  const int64_t N = ids.size(0), k = ids.size(1);
  const bool ok = (x.ndim() == 2 && x.size(0) == N && x.size(1) == K) ||
                  (x.ndim() == 3 && x.size(0) == N && x.size(1) == k && x.size(2) == K);
  if (!ok)
    fail(name, what, " ", x.label(), " is ", x.shape().str(), " but ids are ", ids.shape().str(),
         ": it must be [", N, ", ", K, "] or [", N, ", ", k, ", ", K, "]");
  if (x.dtype() == i32 || is_quantized(x.dtype()))
    fail(name, what, " ", x.shape().str(), " is ", dtype_name(x.dtype()),
         ": it must be f32, f16 or bf16");
  return unit_rows(x.dtype() == f32 ? x : x.to(f32));
}

}  // namespace

Tensor expert_matmul(Tensor x, Tensor w, Tensor ids) {
  constexpr const char* kName = "expert_matmul";
  detail::check_defined(kName, {x, w, ids});
  detail::check_same_ctx(kName, {x, w, ids});
  detail::check_dtype(kName, "ids", ids, i32);
  if (ids.ndim() != 2) fail(kName, "ids must be [N, k] (i32), got ", ids.shape().str());
  if (w.ndim() != 3)
    fail(kName, "w ", w.label(), " is ", w.shape().str(),
         ": it must be [E, M, K], the E experts' [M, K] weights stacked");
  if (w.dtype() == i32) fail(kName, "w ", w.shape().str(), " is i32: it must be a float type");
  if (is_quantized(w.dtype())) {
    const int qa = w.node()->quant_axis();
    if (qa != 1 && qa != 2)
      fail(kName, "the quantized w ", w.label(), " ", w.shape().str(), " has its blocks along dim ",
           qa, ": they must run along K (dim 2) or M (dim 1)");
    if (!quant_type(w.dtype()).matmul_reads)
      fail(kName, "w ", w.label(), " ", w.shape().str(), " is ", dtype_name(w.dtype()),
           ", which the quantized matmul does not read as stored (kiln/quant_types.def)");
  }
  const int64_t M = w.size(1), K = w.size(2);
  x = expert_rows(kName, "x", x, ids, K);
  return Tensor(detail::new_op(Op::EXPERT_MATMUL, f32, Shape{ids.size(0), ids.size(1), M},
                               {x.node(), w.node(), ids.node()}));
}

namespace detail {

// dw [E, M, K] of expert_matmul: dy [N, k, M], x as the forward's, ids [N, k].
Tensor expert_matmul_back_weight(Tensor dy, Tensor x, Tensor ids, int64_t E) {
  constexpr const char* kName = "expert_matmul_back_weight";
  check_dtype(kName, "ids", ids, i32);
  const int64_t M = dy.size(-1), K = x.size(-1);
  x = expert_rows(kName, "x", x, ids, K);
  dy = expert_rows(kName, "dy", dy, ids, M);
  if (dy.ndim() != 3) fail(kName, "dy must be [N, k, M], got ", dy.shape().str());
  return Tensor(new_op(Op::EXPERT_MATMUL_BACK_WEIGHT, f32, Shape{E, M, K},
                       {dy.node(), x.node(), ids.node()}));
}

// dx[n] = sum_j w[ids[n, j]]^T dy[n, j]: the same op on the transposed experts
// (a view; quantized weights are then read by the dy @ W kernel), summed over
// j when one x row served all k experts. dw: the grouped outer products.
void backward_EXPERT_MATMUL(GradCtx& g) {
  const Tensor x = g.src(0), w = g.src(1), ids = g.src(2);
  if (g.needs(0)) {
    Tensor dx = expert_matmul(g.grad(), w.permute({0, 2, 1}), ids);
    g.add(0, x.ndim() == 2 ? sum(dx, 1) : dx);
  }
  if (g.needs(1)) {
    if (is_quantized(w.dtype()))
      fail("expert_matmul", "the quantized experts' weight ", w.label(), " ", w.shape().str(),
           " is ", dtype_name(w.dtype()), " and gets no gradient: it must be frozen");
    g.add(1, expert_matmul_back_weight(g.grad(), x, ids, w.size(0)));
  }
}

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
