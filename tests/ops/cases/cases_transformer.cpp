// Cases: the fused transformer ops. LAYER_NORM (affine or not, strided, D with
// vector tails), its backward kernels on their own, ATTENTION (causal or not,
// Tq != Tk as with a KV cache, permuted q/k/v, 3-D), ATTENTION_BACK on its own,
// CROSS_ENTROPY (-inf logits) and CROSS_ENTROPY_BACK. Multi-threaded sizes run
// without finite differences (their grads are compared with the reference's).
// The composite cases of cases_nn.cpp (layer_norm_*, cross_entropy_labels*)
// check the same builders against independent specs.
#include <cmath>
#include <limits>

#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;
constexpr double kInf = std::numeric_limits<double>::infinity();

Case no_fd(Case c) {
  c.fd = false;
  return c;
}

void add_layer_norm(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(5, 768), D = z(37, 128);
  const Gen wg = gen::uniform(0.5, 1.5);
  auto ln = [](bool w, bool b, float eps) {
    return [=](Context&, X x) {
      Tensor wt = w ? x[1] : Tensor(), bt = b ? x[w ? 2 : 1] : Tensor();
      return layer_norm(x[0], wt, bt, eps);
    };
  };
  cs.push_back(make_case("layer_norm_fused", {Op::LAYER_NORM},
                         {in("x", {R, D}, gen::uniform(-2, 2))}, ln(false, false, 1e-5f), true));
  cs.push_back(make_case("layer_norm_fused_affine", {Op::LAYER_NORM},
                         {in("x", {R, D}), in("w", {D}, wg), in("b", {D})}, ln(true, true, 1e-5f),
                         true));
  cs.push_back(make_case("layer_norm_fused_bias_only_3d_transposed", {Op::LAYER_NORM},
                         {with(in("x", {2, R, D}), Layout::transposed), in("b", {D})},
                         ln(false, true, 1e-3f), true));
  cs.push_back(make_case("layer_norm_fused_d16", {Op::LAYER_NORM},
                         {in("x", {3, R, 16}), in("w", {16}, wg), in("b", {16})},
                         ln(true, true, 1e-5f), true));
  const int64_t RM = z(300, 3072), DM = z(67, 128);
  cs.push_back(no_fd(make_case("layer_norm_fused_mt", {Op::LAYER_NORM},
                               {in("x", {RM, DM}), in("w", {DM}, wg), in("b", {DM})},
                               ln(true, true, 1e-5f), true)));

  // The backward kernels on their own (no gradient rules of their own).
  for (const bool w : {false, true}) {
    const LayerNormParams p{1e-5f, w, false};
    std::vector<Input> ins = {in("dy", {R, D}), in("x", {R, D}, gen::uniform(-2, 2))};
    if (w) ins.push_back(in("w", {D}, wg));
    cs.push_back(make_case(
        w ? "layer_norm_back_weight" : "layer_norm_back", {Op::LAYER_NORM_BACK}, ins,
        [p, w](Context&, X x) {
          return detail::make_op(Op::LAYER_NORM_BACK, DType::f32, x[1].shape(),
                                 {x[0], x[1], w ? x[2] : Tensor()}, p);
        },
        false));
  }
  for (const int64_t rows : {R, RM}) {
    Case c = make_case(
        rows == R ? "layer_norm_back_affine" : "layer_norm_back_affine_mt",
        {Op::LAYER_NORM_BACK_AFFINE},
        {with(in("dy", {rows, D}), Layout::transposed), in("x", {rows, D}, gen::uniform(-2, 2))},
        [D](Context&, X x) {
          return detail::make_op(Op::LAYER_NORM_BACK_AFFINE, DType::f32, Shape{2, D}, {x[0], x[1]},
                                 LayerNormParams{1e-5f, true, true});
        },
        false);
    c.tol = {2e-5, 2e-5};  // sums over up to 3072 rows
    cs.push_back(c);
  }
}

void add_attention(std::vector<Case>& cs, Sz z) {
  const int64_t B = 2, H = z(2, 4), T = z(7, 256), E = z(5, 32);
  struct At {
    std::string name;
    std::vector<Input> ins;
    AttentionOptions opt;
  };
  const Gen g = gen::uniform(-1.5, 1.5);
  std::vector<At> ats = {
      {"causal",
       {in("q", {B, H, T, E}, g), in("k", {B, H, T, E}, g), in("v", {B, H, T, E})},
       {0.0f, true}},
      {"full_scale",
       {in("q", {B, H, T, E}, g), in("k", {B, H, T, E}, g), in("v", {B, H, T, E})},
       {0.7f, false}},
      // Three queries against nine keys, bottom-right aligned (a KV cache).
      {"causal_kv",
       {in("q", {B, H, 3, E}, g), in("k", {B, H, T + 2, E}, g), in("v", {B, H, T + 2, E})},
       {0.0f, true}},
      // More queries than keys: the first rows see no key and give zeros.
      {"causal_more_queries",
       {in("q", {1, 2, T + 2, E}, g), in("k", {1, 2, 3, E}, g), in("v", {1, 2, 3, E})},
       {0.0f, true}},
      {"permuted",
       {with(in("q", {B, H, T, E}, g), Layout::permuted),
        with(in("k", {B, H, T, E}, g), Layout::permuted),
        with(in("v", {B, H, T, E}), Layout::narrowed)},
       {0.0f, true}},
      {"3d_e16",
       {in("q", {3, T, 16}, g), in("k", {3, T, 16}, g), in("v", {3, T, 16})},
       {0.25f, true}},
  };
  for (const At& a : ats) {
    const AttentionOptions opt = a.opt;
    cs.push_back(make_case(
        "attention_" + a.name, {Op::ATTENTION}, a.ins,
        [opt](Context&, X x) { return attention(x[0], x[1], x[2], opt); }, true));
  }
  // Many heads and a long sequence: several key blocks, threads split heads.
  const int64_t TM = z(40, 512), HM = z(6, 8);
  cs.push_back(no_fd(make_case(
      "attention_causal_mt", {Op::ATTENTION},
      {in("q", {2, HM, TM, 16}, g), in("k", {2, HM, TM, 16}, g), in("v", {2, HM, TM, 16})},
      [](Context&, X x) {
        return attention(x[0], x[1], x[2], {0.0f, true});
      },
      true)));
  // ATTENTION_BACK alone: q, k, v, out = attention(q, k, v), d out.
  for (const bool causal : {false, true}) {
    Case c = make_case(
        causal ? "attention_back_causal" : "attention_back", {Op::ATTENTION_BACK},
        {in("q", {B, H, T, E}, g), in("k", {B, H, T + 1, E}, g), in("v", {B, H, T + 1, E}),
         in("dout", {B, H, T, E})},
        [causal](Context&, X x) {
          const AttentionParams p{0.5f, causal};
          Tensor o = attention(x[0], x[1], x[2], {0.5f, causal});
          const int64_t n = x[0].numel() + x[1].numel() + x[2].numel();
          return detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{n},
                                 {x[0], x[1], x[2], o, x[3]}, p);
        },
        false);
    c.tol = {1e-5, 1e-5};
    cs.push_back(c);
  }
}

void add_cross_entropy(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(6, 768), C = z(37, 256);
  auto ce = [](Context&, X x) { return cross_entropy(x[0], x[1]); };
  const Input labels = in_i32("labels", {N}, gen::integers(0, C - 1));
  cs.push_back(make_case("cross_entropy_fused", {Op::CROSS_ENTROPY},
                         {in("logits", {N, C}, gen::uniform(-4, 4)), labels}, ce, true));
  cs.push_back(make_case("cross_entropy_fused_narrowed", {Op::CROSS_ENTROPY},
                         {with(in("logits", {N, C}), Layout::narrowed), labels}, ce, true));
  cs.push_back(make_case("cross_entropy_fused_c16", {Op::CROSS_ENTROPY},
                         {in("logits", {N, 16}), in_i32("labels", {N}, gen::integers(0, 15))}, ce,
                         true));
  // -inf in non-target logits (a masked vocabulary): the loss stays finite. Every
  // row is 0.5, -inf, -1, 2, -inf, 0.25 and the labels pick 0, 2, 3 or 5.
  Case inf =
      make_case("cross_entropy_neg_inf_logits", {Op::CROSS_ENTROPY},
                {constant(in("logits", {4, 6}, gen::values({0.5, -kInf, -1, 2, -kInf, 0.25}))),
                 in_i32("labels", {4}, gen::values({0, 2, 3, 5}))},
                ce, false);
  inf.spec = [](const std::vector<RefValue>&, const RefValue& out) {
    return std::isfinite(out.v[0]) ? std::string() : "loss is not finite";
  };
  cs.push_back(inf);
  const int64_t NM = z(700, 3072);
  cs.push_back(no_fd(make_case(
      "cross_entropy_fused_mt", {Op::CROSS_ENTROPY},
      {in("logits", {NM, 256}, gen::uniform(-3, 3)), in_i32("labels", {NM}, gen::integers(0, 255))},
      ce, true)));
  // CROSS_ENTROPY_BACK alone; the incoming gradient is a computed scalar.
  cs.push_back(make_case(
      "cross_entropy_back", {Op::CROSS_ENTROPY_BACK},
      {in("logits", {N, C}, gen::uniform(-3, 3)), labels, in("g", {2})},
      [](Context&, X x) {
        return detail::make_op(Op::CROSS_ENTROPY_BACK, DType::f32, x[0].shape(),
                               {x[0], x[1], sum(x[2])});
      },
      false));
}

}  // namespace

void add_transformer_cases(std::vector<Case>& cs, Sz z) {
  add_layer_norm(cs, z);
  add_attention(cs, z);
  add_cross_entropy(cs, z);
}

}  // namespace kiln::test
