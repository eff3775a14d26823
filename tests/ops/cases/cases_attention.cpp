// Cases: the fused ATTENTION (causal or not, Tq != Tk as with a KV cache,
// permuted q/k/v, 3-D) and ATTENTION_BACK on its own. Multi-threaded sizes run
// without finite differences (their grads are compared with the reference's).
#include <cmath>
#include <limits>

#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

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

}  // namespace

void add_attention_cases(std::vector<Case>& cs, Sz z) { add_attention(cs, z); }

}  // namespace kiln::test
