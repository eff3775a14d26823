// attention(): the fused ATTENTION primitive and its backward rule.
//
// Semantics (PyTorch's scaled_dot_product_attention without dropout): q
// [..., Tq, E], k and v [..., Tk, E] with identical leading dims (no broadcasting,
// no grouped heads); scale 0 means 1/sqrt(E); causal masks key j for query i when
// j > i + (Tk - Tq) (bottom-right aligned as softmax's causal flag, so one query
// against a KV cache sees every key). A query row that sees no key gives zeros.
#include <cmath>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& opt) {
  const char* op = "attention";
  detail::check_defined(op, {q, k, v});
  detail::check_same_ctx(op, {q, k, v});
  detail::check_float32(op, "q", q);
  detail::check_float32(op, "k", k);
  detail::check_float32(op, "v", v);
  if (q.ndim() < 2) fail(op, "q must be [..., Tq, E], got ", q.shape().str());
  if (k.ndim() != q.ndim() || v.ndim() != q.ndim())
    fail(op, "q ", q.shape().str(), ", k ", k.shape().str(), " and v ", v.shape().str(),
         " must have the same number of dimensions");
  const int nd = q.ndim();
  for (int d = 0; d < nd - 2; ++d)
    if (k.shape()[d] != q.shape()[d] || v.shape()[d] != q.shape()[d])
      fail(op, "leading dims differ: q ", q.shape().str(), ", k ", k.shape().str(), ", v ",
           v.shape().str());
  const int64_t e = q.shape()[nd - 1];
  if (k.shape()[nd - 1] != e || v.shape()[nd - 1] != e)
    fail(op, "q ", q.shape().str(), ", k ", k.shape().str(), " and v ", v.shape().str(),
         " must have the same last dim E");
  if (v.shape()[nd - 2] != k.shape()[nd - 2])
    fail(op, "k ", k.shape().str(), " and v ", v.shape().str(), " must have the same length Tk");
  if (!std::isfinite(opt.scale) || opt.scale < 0)
    fail(op, "scale must be finite and >= 0 (0: 1/sqrt(E)), got ", opt.scale);
  const float scale = opt.scale > 0 ? opt.scale : 1.0f / std::sqrt(float(e > 0 ? e : 1));
  return Tensor(detail::new_op(Op::ATTENTION, f32, q.shape(), {q.node(), k.node(), v.node()},
                               AttentionParams{scale, opt.causal}));
}

namespace detail {

// One ATTENTION_BACK node computes dq, dk and dv together (one pass over the
// key blocks per head); its flat result holds them one after the other and the
// rule hands out contiguous views of it.
void backward_ATTENTION(GradCtx& g) {
  Tensor q = g.src(0), k = g.src(1), v = g.src(2);
  if (!g.needs(0) && !g.needs(1) && !g.needs(2)) return;
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  Tensor packed(new_op(Op::ATTENTION_BACK, f32, Shape{nq + nk + nv},
                       {q.node(), k.node(), v.node(), g.out().node(), g.grad().node()},
                       g.params<Op::ATTENTION>()));
  if (g.needs(0)) g.add(0, packed.narrow(0, 0, nq).view(q.shape()));
  if (g.needs(1)) g.add(1, packed.narrow(0, nq, nk).view(k.shape()));
  if (g.needs(2)) g.add(2, packed.narrow(0, nq + nk, nv).view(v.shape()));
}

}  // namespace detail

}  // namespace kiln
