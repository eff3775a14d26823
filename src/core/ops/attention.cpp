// attention(): the fused ATTENTION primitive and its backward rule; rope(): the
// fused ROPE primitive (rotary position embeddings) and its backward rule.
//
// Semantics (PyTorch's scaled_dot_product_attention): q
// [..., Tq, E], k and v [..., Tk, E] with identical leading dims (no broadcasting,
// no grouped heads); scale 0 means 1/sqrt(E); causal masks key j for query i when
// j > i + (Tk - Tq) (bottom-right aligned as softmax's causal flag, so one query
// against a KV cache sees every key). Segment ids (packed examples) mask key j
// for query i unless one run of equal ids holds both: an example is a run, so
// the kernels see a key range [start of the run, causal limit) per row. A
// query row that sees no key gives zeros. Dropout (training) zeroes softmax
// weights by the dropout op's mask of the [..., Tq, Tk] weights (same seed,
// same bits), inside the kernels, and scales the kept ones by 1 / (1 - p); the
// backward recomputes the bits from (seed, position).
// q, k, v are all f32 or all bf16; the output has their dtype. bf16 inputs
// multiply exactly with f32 accumulation; the CPU kernel rounds the softmax
// weights to bf16 for PV where it runs vdpbf16ps (as FlashAttention does).
#include <algorithm>
#include <cmath>
#include <utility>

#include "core/autodiff.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ops.h"

namespace kiln {

Tensor attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& opt) {
  const char* op = "attention";
  detail::check_defined(op, {q, k, v});
  detail::check_same_ctx(op, {q, k, v});
  // The context's bf16 policy (Context::set_matmul_precision): q, k and v cast to
  // bf16, so QK^T and PV run on bf16 products (f32 accumulation, softmax in f32)
  // and the output is bf16 like its inputs (its consumer, the output projection,
  // would cast it anyway).
  if (q.node()->ctx->matmul_precision() == bf16) {
    if (q.dtype() == f32) q = q.to(bf16);
    if (k.dtype() == f32) k = k.to(bf16);
    if (v.dtype() == f32) v = v.to(bf16);
  }
  for (auto [what, t] : {std::pair{"q", q}, {"k", k}, {"v", v}})
    if (t.dtype() != f32 && t.dtype() != bf16)
      fail(op, what, " ", t.label(), " is ", dtype_name(t.dtype()),
           ": q, k and v must be f32 or bf16");
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype())
    fail(op, "q is ", dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()), " and v ",
         dtype_name(v.dtype()), ": all three must have one dtype");
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
  if (!(opt.dropout >= 0.0f && opt.dropout < 1.0f))
    fail(op, "dropout must be in [0, 1), got ", opt.dropout);
  AttentionParams prm{scale, opt.causal};
  TensorNode *seg_node = nullptr, *seed_node = nullptr;  // the optional sources, in this order
  if (opt.segments.defined()) {
    const Tensor seg = opt.segments;
    detail::check_same_ctx(op, {q, seg});
    const int64_t tq = q.shape()[nd - 2], tk = k.shape()[nd - 2];
    if (tq != tk)
      fail(op, "segments need as many queries as keys (packed training), got q ", q.shape().str(),
           " and k ", k.shape().str());
    int64_t heads = 1;
    for (int d = 0; d < nd - 2; ++d) heads *= q.shape()[d];
    if (seg.dtype() != i32 || seg.ndim() != 2 || seg.size(1) != tq || seg.size(0) < 1 ||
        heads % seg.size(0) != 0)
      fail(op, "segments ", seg.label(), " must be i32 [S, T] with T = ", tq,
           " and S dividing the ", heads, " heads of q ", q.shape().str(), ", got ",
           dtype_name(seg.dtype()), " ", seg.shape().str());
    prm.segmented = true;
    seg_node = seg.node();
  }
  if (opt.dropout > 0.0f) {
    prm.keep = 1.0f - opt.dropout;
    prm.seed = int64_t(opt.seed);
    if (opt.seed_tensor.defined()) {
      const Tensor st = opt.seed_tensor;
      detail::check_same_ctx(op, {q, st});
      detail::check_dtype(op, "seed_tensor", st, i32);
      if (st.numel() < 1) fail(op, "seed_tensor ", st.shape().str(), " has no elements");
      prm.seeded = true;
      seed_node = st.node();
    }
  }
  // Present optional sources follow v without a gap (new_op drops trailing nulls only).
  return Tensor(detail::new_op(Op::ATTENTION, q.dtype(), q.shape(),
                               {q.node(), k.node(), v.node(), seg_node ? seg_node : seed_node,
                                seg_node ? seed_node : nullptr},
                               prm));
}

Tensor rope(Tensor x, Tensor cos, Tensor sin) {
  const char* op = "rope";
  detail::check_defined(op, {x, cos, sin});
  detail::check_same_ctx(op, {x, cos, sin});
  detail::check_float32(op, "x", x);
  detail::check_float32(op, "cos", cos);
  detail::check_float32(op, "sin", sin);
  if (x.ndim() != 4) fail(op, "x must be [B, T, H, D], got ", x.label(), " ", x.shape().str());
  const int64_t t = x.size(1), d = x.size(3);
  if (d % 2 != 0) fail(op, "the head dim D of x ", x.shape().str(), " must be even (rotate-half)");
  const Shape want{t, d}, per_row{x.size(0), t, d};
  if ((cos.shape() != want && cos.shape() != per_row) || sin.shape() != cos.shape())
    fail(op, "cos ", cos.shape().str(), " and sin ", sin.shape().str(),
         " must both be [T, D] = ", want.str(), " or [B, T, D] = ", per_row.str(), " for x ",
         x.shape().str(),
         " (narrow longer tables to the positions of x: table.narrow(0, start, T), or gather "
         "per-sequence positions: embedding(positions, table))");
  return Tensor(detail::new_op(Op::ROPE, f32, x.shape(), {x.node(), cos.node(), sin.node()}));
}

namespace detail {

// ROPE is linear in x: dx is its adjoint (ROPE_BACK, the rotation by -angle
// when the tables are HF's). The tables get sum over batch and heads of
// dy * x (cos) and dy * rotate_half(x) (sin), as composites: they are
// constants in the models, so this runs only when a program trains them.
void backward_ROPE(GradCtx& g) {
  Tensor dy = g.grad(), cos = g.src(1), sin = g.src(2);
  if (g.needs(0))
    g.add(0, Tensor(new_op(Op::ROPE_BACK, f32, dy.shape(), {dy.node(), cos.node(), sin.node()})));
  if (!g.needs(1) && !g.needs(2)) return;
  Tensor x = g.src(0);
  const int64_t half = x.size(3) / 2;
  // [T, D] tables: summed over batch and heads; [B, T, D]: over heads.
  const bool per_row = cos.ndim() == 3;
  auto over_batch_and_heads = [per_row](Tensor p) {
    return per_row ? sum(p, 2) : sum(sum(p, 2), 0);
  };
  if (g.needs(1)) g.add(1, over_batch_and_heads(dy * x));
  if (g.needs(2)) {
    Tensor rotated = kiln::concat({neg(x.narrow(3, half, half)), x.narrow(3, 0, half)}, 3);
    g.add(2, over_batch_and_heads(dy * rotated));
  }
}

namespace {

// q, k or v as a slice of another tensor: NARROW(x, dim, start, length),
// optionally permuted on top (the GPT's heads: [B, T, 3H, D] narrowed to H
// heads, permuted to [B, H, T, D]).
struct Slice {
  TensorNode* x = nullptr;
  NarrowParams n;
  const TensorNode* perm = nullptr;  // the PERMUTE on top, or null
};

Slice slice_of(TensorNode* t) {
  Slice s;
  if (t->op == Op::PERMUTE) {
    s.perm = t;
    t = t->src[0];
  }
  if (t->op != Op::NARROW) return {};
  s.x = t->src[0];
  s.n = op_params<Op::NARROW>(*t);
  return s;
}

// Whether q, k and v are adjacent slices of one contiguous tensor x along one
// dim that together cover it (in any order), under one permutation, with unit
// column stride. Then ATTENTION_BACK writes dq, dk and dv into one tensor of
// x's shape, each where its source sits in x (the kernels' grad_head), and
// their gradients join there as views (sum_grads in core/autodiff.cpp): no
// concat of the three.
bool slices_of_one(const Slice s[3]) {
  const TensorNode* x = s[0].x;
  if (!x || !x->is_contiguous()) return false;
  int64_t len = 0;
  for (int i = 0; i < 3; ++i) {
    if (s[i].x != x || s[i].n.dim != s[0].n.dim || (s[i].perm == nullptr) != (s[0].perm == nullptr))
      return false;
    if (s[i].perm &&
        op_params<Op::PERMUTE>(*s[i].perm).axes != op_params<Op::PERMUTE>(*s[0].perm).axes)
      return false;
    len += s[i].n.length;
  }
  if (len != x->shape[int(s[0].n.dim)]) return false;
  // Adjacent and covering: in order of start, each range ends where the next
  // one starts.
  NarrowParams r[3] = {s[0].n, s[1].n, s[2].n};
  std::sort(r, r + 3, [](const NarrowParams& a, const NarrowParams& b) {
    return std::pair{a.start, a.length} < std::pair{b.start, b.length};
  });
  return r[0].start == 0 && r[0].start + r[0].length == r[1].start &&
         r[1].start + r[1].length == r[2].start;
}

// s's view of t (t shaped like s.x).
Tensor like(Tensor t, const Slice& s) {
  t = t.narrow(int(s.n.dim), s.n.start, s.n.length);
  if (!s.perm) return t;
  const auto a = op_params<Op::PERMUTE>(*s.perm).axes;
  switch (t.ndim()) {
    case 2: return t.permute({int(a[0]), int(a[1])});
    case 3: return t.permute({int(a[0]), int(a[1]), int(a[2])});
    default: return t.permute({int(a[0]), int(a[1]), int(a[2]), int(a[3])});
  }
}

}  // namespace

// One ATTENTION_BACK node computes dq, dk and dv together (one pass over the
// key blocks per head). Its result holds them one after the other (flat) and
// the rule hands out contiguous views of it; or, when q, k and v are slices of
// one tensor x (slices_of_one), it is shaped like x and the rule hands out the
// same slices of it.
void backward_ATTENTION(GradCtx& g) {
  Tensor q = g.src(0), k = g.src(1), v = g.src(2);
  if (!g.needs(0) && !g.needs(1) && !g.needs(2)) return;
  // Segment ids (packed examples) and the dropout seed tensor follow dO, as
  // in the forward (present ones without a gap; new_op drops trailing nulls).
  const AttentionParams& prm = g.params<Op::ATTENTION>();
  TensorNode* extra0 = prm.segmented || prm.seeded ? g.src(3).node() : nullptr;
  TensorNode* extra1 = prm.segmented && prm.seeded ? g.src(4).node() : nullptr;
  const std::initializer_list<TensorNode*> srcs = {
      q.node(), k.node(), v.node(), g.out().node(), g.grad().node(), extra0, extra1};
  const Slice s[3] = {slice_of(q.node()), slice_of(k.node()), slice_of(v.node())};
  // Rows of unit column stride; strided views (a backend that copies a
  // source keeps a strided view a view of the copied tensor, at its offset,
  // which the kernels place the gradients by).
  auto fits = [](const Tensor& t) {
    return t.node()->stride[size_t(t.ndim() - 1)] == int64_t(t.node()->elem_size()) &&
           !t.node()->is_contiguous();
  };
  if (slices_of_one(s) && fits(q) && fits(k) && fits(v)) {
    Tensor packed(new_op(Op::ATTENTION_BACK, f32, s[0].x->shape, srcs, g.params<Op::ATTENTION>()));
    for (int i = 0; i < 3; ++i)
      if (g.needs(i)) g.add(i, like(packed, s[i]));
    return;
  }
  const int64_t nq = q.numel(), nk = k.numel(), nv = v.numel();
  Tensor packed(
      new_op(Op::ATTENTION_BACK, f32, Shape{nq + nk + nv}, srcs, g.params<Op::ATTENTION>()));
  if (g.needs(0)) g.add(0, packed.narrow(0, 0, nq).view(q.shape()));
  if (g.needs(1)) g.add(1, packed.narrow(0, nq, nk).view(k.shape()));
  if (g.needs(2)) g.add(2, packed.narrow(0, nq + nk, nv).view(v.shape()));
}

}  // namespace detail

}  // namespace kiln
