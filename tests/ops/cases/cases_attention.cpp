// Cases: the fused ATTENTION (causal or not, Tq != Tk as with a KV cache,
// permuted q/k/v, 3-D, grouped heads through broadcast k/v) and ATTENTION_BACK on its own; ROPE
// (tables of any values, strided x and tables, tables narrowed at a KV cache's offset, gradients of
// x and of the tables, per-sequence tables) and ROPE_BACK on its own; segment
// ids (packed examples) through every kernel path; dropout on the weights. Multi-threaded sizes run
// without finite differences (their grads are compared with the reference's).
#include <array>
#include <cmath>
#include <limits>
#include <string>

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
  // 128 keys: the packed k^T / v^T rows get padded apart (packed_ld in the kernel).
  cs.push_back(no_fd(make_case(
      "attention_causal_t128", {Op::ATTENTION},
      {in("q", {1, 2, 128, 16}, g), in("k", {1, 2, 128, 16}, g), in("v", {1, 2, 128, 16})},
      [](Context&, X x) {
        return attention(x[0], x[1], x[2], {0.0f, true});
      },
      true)));
  // Grouped-query attention as models pass it: q [Hkv, G, T, E] against k and
  // v broadcast over G (stride 0), which the kernel packs once per group.
  // The second one: several key blocks, E = 64 (whole 4-vector chunks), a
  // tile edge (150 = 12 x 12 + 6) and threads.
  cs.push_back(make_case(
      "attention_gqa", {Op::ATTENTION},
      {in("q", {2, 3, T, E}, g), expanded(in("k", {2, 3, T, E}, g), {2, 1, T, E}),
       expanded(in("v", {2, 3, T, E}), {2, 1, T, E})},
      [](Context&, X x) {
        return attention(x[0], x[1], x[2], {0.0f, true});
      },
      true));
  for (const bool causal : {true, false})
    cs.push_back(no_fd(make_case(
        causal ? "attention_gqa_mt" : "attention_gqa_mt_full", {Op::ATTENTION},
        {in("q", {3, 3, 150, 64}, g), expanded(in("k", {3, 3, 150, 64}, g), {3, 1, 150, 64}),
         expanded(in("v", {3, 3, 150, 64}), {3, 1, 150, 64})},
        [causal](Context&, X x) {
          return attention(x[0], x[1], x[2], {0.0f, causal});
        },
        true)));

  // bf16 q, k, v (bf16 output): on AVX512_BF16 builds attention_bf16.cpp's
  // vdpbf16ps path, elsewhere the f32 kernel on converted rows. The reference
  // multiplies the stored bf16 values in double; the tolerance covers the
  // softmax weights rounded to bf16 for PV and the bf16 output. Odd E and Tk
  // (pairs with a zero partner), Tq != Tk, rows that see no key, strided views,
  // several key blocks (Tk > 256).
  auto bfa = [&](Input x, Layout l = Layout::contig) { return with(as(x, DType::bf16), l); };
  const std::vector<At> bf_ats = {
      {"bf16_causal",
       {bfa(in("q", {B, H, T, E}, g)), bfa(in("k", {B, H, T, E}, g)), bfa(in("v", {B, H, T, E}))},
       {0.0f, true}},
      {"bf16_full_odd_e",
       {bfa(in("q", {B, H, T, 7}, g)), bfa(in("k", {B, H, T + 2, 7}, g)),
        bfa(in("v", {B, H, T + 2, 7}))},
       {0.6f, false}},
      {"bf16_causal_more_queries",
       {bfa(in("q", {1, 2, T + 2, E}, g)), bfa(in("k", {1, 2, 3, E}, g)),
        bfa(in("v", {1, 2, 3, E}))},
       {0.0f, true}},
      {"bf16_permuted",
       {bfa(in("q", {B, H, T, 32}, g), Layout::permuted),
        bfa(in("k", {B, H, T, 32}, g), Layout::permuted),
        bfa(in("v", {B, H, T, 32}), Layout::narrowed)},
       {0.0f, true}},
      {"bf16_long_e40",
       {bfa(in("q", {1, 2, 300, 40}, g)), bfa(in("k", {1, 2, 301, 40}, g)),
        bfa(in("v", {1, 2, 301, 40}))},
       {0.0f, true}},
  };
  for (const At& a : bf_ats) {
    const AttentionOptions opt = a.opt;
    Case c = make_case(
        "attention_" + a.name, {Op::ATTENTION}, a.ins,
        [opt](Context&, X x) { return attention(x[0], x[1], x[2], opt); }, false);
    c.tol = {8e-3, 8e-3};
    cs.push_back(c);
  }
  // The context's bf16 policy: f32 q, k, v cast in the graph, a bf16 output
  // (read back as f32 here), and the backward pass through ATTENTION_BACK with
  // bf16 q, k, v and dO (their dS and P rounded to bf16 for the products).
  // Finite differences cannot see through the casts: the CPU's gradients are
  // compared with the reference's backward graph.
  Case policy = no_fd(make_case(
      "attention_bf16_precision_policy", {Op::ATTENTION, Op::COPY},
      {in("q", {B, H, T + 3, 24}, g), in("k", {B, H, T + 3, 24}, g), in("v", {B, H, T + 3, 24})},
      [](Context& ctx, X x) {
        ctx.set_matmul_precision(bf16);
        return attention(x[0], x[1], x[2], {0.0f, true}).to(f32);
      },
      true));
  policy.tol = {8e-3, 8e-3};
  policy.grad_tol = {2e-2, 2e-2};
  cs.push_back(policy);
  // ATTENTION_BACK alone in bf16 (q, k, v, O and dO bf16; dq, dk, dv f32).
  for (const bool causal : {false, true}) {
    Case c = make_case(
        causal ? "attention_back_bf16_causal" : "attention_back_bf16", {Op::ATTENTION_BACK},
        {bfa(in("q", {B, H, T, 9}, g)), bfa(in("k", {B, H, T + 1, 9}, g)),
         bfa(in("v", {B, H, T + 1, 9})), bfa(in("dout", {B, H, T, 9}))},
        [causal](Context&, X x) {
          const AttentionParams p{0.5f, causal};
          Tensor o = attention(x[0], x[1], x[2], {0.5f, causal});
          const int64_t n = x[0].numel() + x[1].numel() + x[2].numel();
          return detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{n},
                                 {x[0], x[1], x[2], o, x[3]}, p);
        },
        false);
    c.tol = {1e-2, 1e-2};
    cs.push_back(c);
  }
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

// The small-head kernels (attention_small.cpp: Tq, Tk <= 64 and E <= 64, whole
// heads per thread) at kiln-gpt's shape (T = 64, E = 32) and around it, and the
// tiled kernels' backward just past that bound (Tk = 70), which the small
// shapes of add_attention no longer reach.
void add_attention_small(std::vector<Case>& cs) {
  const Gen g = gen::uniform(-1.5, 1.5);
  auto bfa = [](Input x) { return as(x, DType::bf16); };
  auto back = [](bool causal, float scale) {
    return [causal, scale](Context&, X x) {
      const AttentionParams p{scale, causal};
      Tensor o = attention(x[0], x[1], x[2], {scale, causal});
      const int64_t n = x[0].numel() + x[1].numel() + x[2].numel();
      return detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{n}, {x[0], x[1], x[2], o, x[3]},
                             p);
    };
  };
  for (const bool causal : {true, false}) {
    const std::string sfx = causal ? "_causal" : "_full";
    // Finite differences through a few row tiles, a partial last tile (13 =
    // 2 x 6 + 1) and E with a partial vector.
    cs.push_back(make_case(
        "attention_small" + sfx, {Op::ATTENTION},
        {in("q", {1, 3, 13, 20}, g), in("k", {1, 3, 13, 20}, g), in("v", {1, 3, 13, 20})},
        [causal](Context&, X x) {
          return attention(x[0], x[1], x[2], {0.0f, causal});
        },
        true));
    // The GPT shape (8 heads, so 2 and 3 threads split them differently):
    // gradients against the reference's backward graph.
    cs.push_back(no_fd(make_case(
        "attention_small_gpt" + sfx, {Op::ATTENTION},
        {in("q", {2, 4, 64, 32}, g), in("k", {2, 4, 64, 32}, g), in("v", {2, 4, 64, 32})},
        [causal](Context&, X x) {
          return attention(x[0], x[1], x[2], {0.0f, causal});
        },
        true)));
    // Whole 4-vector rows (E = 64) and fewer queries than keys (a KV cache).
    cs.push_back(no_fd(make_case(
        "attention_small_e64_kv" + sfx, {Op::ATTENTION},
        {with(in("q", {2, 3, 50, 64}, g), Layout::permuted), in("k", {2, 3, 64, 64}, g),
         in("v", {2, 3, 64, 64})},
        [causal](Context&, X x) {
          return attention(x[0], x[1], x[2], {0.3f, causal});
        },
        true)));
    Case bf = make_case(
        "attention_small_gpt_bf16" + sfx, {Op::ATTENTION},
        {bfa(in("q", {2, 4, 64, 32}, g)), bfa(in("k", {2, 4, 64, 32}, g)),
         bfa(in("v", {2, 4, 64, 32}))},
        [causal](Context&, X x) {
          return attention(x[0], x[1], x[2], {0.0f, causal});
        },
        false);
    bf.tol = {8e-3, 8e-3};
    cs.push_back(bf);
    Case b = make_case("attention_back_small_gpt" + sfx, {Op::ATTENTION_BACK},
                       {in("q", {2, 4, 64, 32}, g), in("k", {2, 4, 64, 32}, g),
                        in("v", {2, 4, 64, 32}), in("dout", {2, 4, 64, 32})},
                       back(causal, 0.17677669f), false);
    b.tol = {1e-5, 1e-5};
    cs.push_back(b);
    Case bb = make_case("attention_back_small_gpt_bf16" + sfx, {Op::ATTENTION_BACK},
                        {bfa(in("q", {2, 4, 64, 32}, g)), bfa(in("k", {2, 4, 64, 32}, g)),
                         bfa(in("v", {2, 4, 64, 32})), bfa(in("dout", {2, 4, 64, 32}))},
                        back(causal, 0.17677669f), false);
    bb.tol = {1e-2, 1e-2};
    cs.push_back(bb);
    // Past the small kernels' bound: the tiled backward, f32 and bf16.
    Case tl = make_case("attention_back_tiled" + sfx, {Op::ATTENTION_BACK},
                        {in("q", {1, 2, 66, 24}, g), in("k", {1, 2, 70, 24}, g),
                         in("v", {1, 2, 70, 24}), in("dout", {1, 2, 66, 24})},
                        back(causal, 0.4f), false);
    tl.tol = {1e-5, 1e-5};
    cs.push_back(tl);
    Case tb = make_case("attention_back_tiled_bf16" + sfx, {Op::ATTENTION_BACK},
                        {bfa(in("q", {1, 2, 66, 24}, g)), bfa(in("k", {1, 2, 70, 24}, g)),
                         bfa(in("v", {1, 2, 70, 24})), bfa(in("dout", {1, 2, 66, 24}))},
                        back(causal, 0.4f), false);
    tb.tol = {1e-2, 1e-2};
    cs.push_back(tb);
  }

  // q, k and v as slices of one tensor x, as nn::CausalSelfAttention takes
  // them ([B, T, 3H, E] narrowed to H heads each, permuted to [B, H, T, E]):
  // ATTENTION_BACK writes the three gradients into one tensor shaped like x,
  // which is x's gradient (no concat). Slices in other orders, along a
  // leading dim without a permute, and each backward kernel: small heads,
  // tiled (T = 70), bf16 under the context's policy.
  struct Sl {
    std::string name;
    Shape x;
    int dim;
    std::array<int, 3> slot;  // where q, k, v sit along dim, in units of H
    bool permute, bf16, fd;
  };
  const std::vector<Sl> sls = {
      {"small", {2, 13, 9, 20}, 2, {0, 1, 2}, true, false, true},
      {"small_vqk", {2, 13, 9, 20}, 2, {1, 2, 0}, true, false, true},
      {"dim1", {2, 6, 13, 20}, 1, {2, 0, 1}, false, false, true},
      {"gpt", {2, 64, 12, 32}, 2, {0, 1, 2}, true, false, false},
      {"tiled", {1, 70, 6, 24}, 2, {0, 1, 2}, true, false, false},
      {"gpt_bf16", {2, 64, 12, 32}, 2, {0, 1, 2}, true, true, false},
      {"tiled_bf16", {1, 70, 6, 24}, 2, {2, 1, 0}, true, true, false},
  };
  for (const Sl& sl : sls) {
    Case c = make_case(
        "attention_qkv_slices_" + sl.name, {Op::ATTENTION}, {in("x", sl.x, g)},
        [sl](Context& ctx, X x) {
          if (sl.bf16) ctx.set_matmul_precision(bf16);
          const Tensor xs = sl.bf16 ? x[0].to(bf16) : x[0];
          const int64_t h = sl.x[sl.dim] / 3;
          auto part = [&](int i) {
            const Tensor t = xs.narrow(sl.dim, sl.slot[size_t(i)] * h, h);
            return sl.permute ? t.permute({0, 2, 1, 3}) : t;
          };
          const Tensor y = attention(part(0), part(1), part(2), {0.0f, true});
          return sl.bf16 ? y.to(f32) : y;
        },
        true);
    if (!sl.fd) c = no_fd(c);
    if (sl.bf16) {
      c.tol = {8e-3, 8e-3};
      c.grad_tol = {2e-2, 2e-2};
    }
    cs.push_back(c);
  }
}

// Segment ids [rows, T]: row r is runs of the lengths runs[r % runs.size()]
// (cut at T, the last run stretched to T), each run's id its index, but with
// an id repeated by a later, separate run (a run is one example either way).
Gen segment_runs(std::vector<std::vector<int64_t>> runs) {
  return [runs](const Shape& s, Rng&) {
    const int64_t rows = s[0], T = s[1];
    std::vector<double> v(size_t(rows * T));
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int64_t>& len = runs[size_t(r) % runs.size()];
      int64_t t = 0;
      for (size_t k = 0; t < T; ++k) {
        const int64_t n = k < len.size() ? len[k] : T;
        for (int64_t i = 0; i < n && t < T; ++i, ++t) v[size_t(r * T + t)] = double(k % 3);
      }
    }
    return v;
  };
}

// ATTENTION with segment ids (packed examples), against the reference's
// pairwise masking: the small-head kernels (T <= 64) with finite
// differences, the tiled kernels past them (runs longer than a 256-key block,
// rows whose keys start mid-chunk, grouped heads), ATTENTION_BACK alone, bf16.
void add_attention_segments(std::vector<Case>& cs) {
  const Gen g = gen::uniform(-1.5, 1.5);
  const std::vector<std::vector<int64_t>> runs = {{3, 1, 5}, {13}, {2, 2, 2}};
  auto seg_attention = [](bool causal, float scale) {
    return [causal, scale](Context&, X x) {
      return attention(x[0], x[1], x[2], {scale, causal, x[3]});
    };
  };
  auto back = [](bool causal, float scale) {
    return [causal, scale](Context&, X x) {
      Tensor o = attention(x[0], x[1], x[2], {scale, causal, x[4]});
      const int64_t n = x[0].numel() + x[1].numel() + x[2].numel();
      return detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{n},
                             {x[0], x[1], x[2], o, x[3], x[4]},
                             AttentionParams{scale, causal, true});
    };
  };
  for (const bool causal : {true, false}) {
    const std::string sfx = causal ? "_causal" : "_full";
    cs.push_back(make_case("attention_segments_small" + sfx, {Op::ATTENTION},
                           {in("q", {2, 1, 13, 6}, g), in("k", {2, 1, 13, 6}, g),
                            in("v", {2, 1, 13, 6}), in_i32("seg", {2, 13}, segment_runs(runs))},
                           seg_attention(causal, 0.0f), true));
    // One row of ids for every head (S = 1), as a batch of one passes them.
    cs.push_back(no_fd(
        make_case("attention_segments_small_one_row" + sfx, {Op::ATTENTION},
                  {in("q", {2, 4, 40, 32}, g), in("k", {2, 4, 40, 32}, g), in("v", {2, 4, 40, 32}),
                   in_i32("seg", {1, 40}, segment_runs({{7, 20, 1, 5}}))},
                  seg_attention(causal, 0.0f), true)));
    // Runs of 3, 270 and the rest: a key block starting mid-run, a run
    // starting mid-chunk; the second row one run (no packing).
    cs.push_back(no_fd(make_case(
        "attention_segments_tiled" + sfx, {Op::ATTENTION},
        {in("q", {2, 1, 300, 16}, g), in("k", {2, 1, 300, 16}, g), in("v", {2, 1, 300, 16}),
         in_i32("seg", {2, 300}, segment_runs({{3, 270}, {300}}))},
        seg_attention(causal, 0.0f), true)));
    // Grouped heads (k and v broadcast over G): tiles of several heads.
    cs.push_back(no_fd(
        make_case("attention_segments_gqa" + sfx, {Op::ATTENTION},
                  {in("q", {2, 3, 90, 16}, g), expanded(in("k", {2, 3, 90, 16}, g), {2, 1, 90, 16}),
                   expanded(in("v", {2, 3, 90, 16}), {2, 1, 90, 16}),
                   in_i32("seg", {1, 90}, segment_runs({{17, 1, 40}}))},
                  seg_attention(causal, 0.0f), true)));
    Case bf = make_case(
        "attention_segments_bf16" + sfx, {Op::ATTENTION},
        {as(in("q", {1, 2, 80, 16}, g), DType::bf16), as(in("k", {1, 2, 80, 16}, g), DType::bf16),
         as(in("v", {1, 2, 80, 16}), DType::bf16), in_i32("seg", {1, 80}, segment_runs({{30, 9}}))},
        seg_attention(causal, 0.0f), false);
    bf.tol = {8e-3, 8e-3};
    cs.push_back(bf);
    for (const int64_t t : {int64_t(29), int64_t(70)}) {  // small and tiled kernels
      Case b =
          make_case("attention_back_segments_t" + std::to_string(t) + sfx, {Op::ATTENTION_BACK},
                    {in("q", {1, 2, t, 12}, g), in("k", {1, 2, t, 12}, g), in("v", {1, 2, t, 12}),
                     in("dout", {1, 2, t, 12}), in_i32("seg", {1, t}, segment_runs({{5, 1, 14}}))},
                    back(causal, 0.3f), false);
      b.tol = {1e-5, 1e-5};
      cs.push_back(b);
    }
  }
}

// Dropout on the weights inside the fused kernels (AttentionOptions::dropout),
// against the reference's mask from the definition (the dropout op's bits of
// the [..., Tq, Tk] weights): a static seed and a seed tensor, causal or not,
// the small-head kernels with finite differences (the mask is fixed, so the
// function is smooth), the tiled kernels (Tk = 70), with segment ids, bf16,
// several threads' heads, and ATTENTION_BACK alone.
void add_attention_dropout(std::vector<Case>& cs) {
  const Gen g = gen::uniform(-1.5, 1.5);
  const Gen seed = [](const Shape& s, Rng&) {
    return std::vector<double>(size_t(s.numel()), 977.0);
  };
  auto opts = [](bool causal, float p, Tensor seg, Tensor seed_t) {
    AttentionOptions o{0.0f, causal, seg};
    o.dropout = p;
    o.seed = 0x5eed;
    o.seed_tensor = seed_t;
    return o;
  };
  for (const bool causal : {true, false}) {
    const std::string sfx = causal ? "_causal" : "_full";
    cs.push_back(make_case(
        "attention_dropout_small" + sfx, {Op::ATTENTION},
        {in("q", {1, 3, 13, 20}, g), in("k", {1, 3, 13, 20}, g), in("v", {1, 3, 13, 20})},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.3f, {}, {})); },
        true));
    cs.push_back(no_fd(make_case(
        "attention_dropout_seeded_gpt" + sfx, {Op::ATTENTION},
        {in("q", {2, 4, 64, 32}, g), in("k", {2, 4, 64, 32}, g), in("v", {2, 4, 64, 32}),
         in_i32("seed", {1}, seed)},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.2f, {}, x[3])); },
        true)));
    // Past the small kernels' bound (Tk = 70): the tiled forward and backward.
    cs.push_back(no_fd(make_case(
        "attention_dropout_tiled" + sfx, {Op::ATTENTION},
        {in("q", {1, 2, 66, 24}, g), in("k", {1, 2, 70, 24}, g), in("v", {1, 2, 70, 24}),
         in_i32("seed", {1}, seed)},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.5f, {}, x[3])); },
        true)));
    // Segment ids and a seed tensor: both optional sources, in order.
    cs.push_back(make_case(
        "attention_dropout_segments" + sfx, {Op::ATTENTION},
        {in("q", {2, 1, 13, 6}, g), in("k", {2, 1, 13, 6}, g), in("v", {2, 1, 13, 6}),
         in_i32("seg", {2, 13}, segment_runs({{3, 1, 5}, {13}})), in_i32("seed", {1}, seed)},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.25f, x[3], x[4])); },
        true));
    cs.push_back(no_fd(make_case(
        "attention_dropout_segments_tiled" + sfx, {Op::ATTENTION},
        {in("q", {1, 2, 90, 16}, g), in("k", {1, 2, 90, 16}, g), in("v", {1, 2, 90, 16}),
         in_i32("seg", {1, 90}, segment_runs({{17, 1, 40}})), in_i32("seed", {1}, seed)},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.2f, x[3], x[4])); },
        true)));
    Case bf = make_case(
        "attention_dropout_bf16" + sfx, {Op::ATTENTION},
        {as(in("q", {1, 2, 80, 16}, g), DType::bf16), as(in("k", {1, 2, 80, 16}, g), DType::bf16),
         as(in("v", {1, 2, 80, 16}), DType::bf16), in_i32("seed", {1}, seed)},
        [=](Context&, X x) { return attention(x[0], x[1], x[2], opts(causal, 0.2f, {}, x[3])); },
        false);
    bf.tol = {1e-2, 1e-2};
    cs.push_back(bf);
    // ATTENTION_BACK alone (small and tiled kernels), with a seed tensor.
    for (const int64_t t : {int64_t(29), int64_t(70)}) {
      Case b = make_case(
          "attention_back_dropout_t" + std::to_string(t) + sfx, {Op::ATTENTION_BACK},
          {in("q", {1, 2, t, 12}, g), in("k", {1, 2, t, 12}, g), in("v", {1, 2, t, 12}),
           in("dout", {1, 2, t, 12}), in_i32("seed", {1}, seed)},
          [=](Context&, X x) {
            AttentionOptions o = opts(causal, 0.3f, {}, x[4]);
            o.scale = 0.3f;
            Tensor out = attention(x[0], x[1], x[2], o);
            AttentionParams p{0.3f, causal};
            p.keep = 0.7f;
            p.seed = 0x5eed;
            p.seeded = true;
            const int64_t n = x[0].numel() + x[1].numel() + x[2].numel();
            return detail::make_op(Op::ATTENTION_BACK, DType::f32, Shape{n},
                                   {x[0], x[1], x[2], out, x[3], x[4]}, p);
          },
          false);
      b.tol = {1e-5, 1e-5};
      cs.push_back(b);
    }
  }
}

// x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x[.., D/2:], x[.., :D/2]).
std::string rope_spec(const std::vector<RefValue>& in, const RefValue& out) {
  const RefValue &x = in[0], &c = in[1], &s = in[2];
  const int64_t T = x.shape[1], H = x.shape[2], D = x.shape[3], h = D / 2;
  RefValue want = x;
  for (size_t k = 0; k < x.v.size(); ++k) {
    const int64_t i = int64_t(k) % D, t = int64_t(k) / (H * D) % T;
    const double rot = i < h ? -x.v[k + size_t(h)] : x.v[k - size_t(h)];
    want.v[k] = x.v[k] * c.v[size_t(t * D + i)] + rot * s.v[size_t(t * D + i)];
  }
  return spec_compare(want, out);
}

void add_rope(std::vector<Case>& cs, Sz z) {
  const int64_t B = 2, T = z(5, 512), H = z(3, 9);
  auto rope3 = [](Context&, X x) { return rope(x[0], x[1], x[2]); };
  // Tables of arbitrary values (not just rotations), so each term of the
  // definition is checked, and D/2 below the vector width.
  Case plain =
      make_case("rope", {Op::ROPE},
                {in("x", {B, T, H, 10}), in("cos", {T, 10}), in("sin", {T, 10})}, rope3, true);
  plain.spec = rope_spec;
  cs.push_back(plain);
  // x a permuted view (HF's [B, H, T, D] read as [B, T, H, D] needs no copy),
  // strided tables, D/2 = 20 (a vector and a tail).
  cs.push_back(make_case(
      "rope_strided", {Op::ROPE},
      {with(in("x", {B, T, H, 40}), Layout::permuted), with(in("cos", {T, 40}), Layout::transposed),
       with(in("sin", {T, 40}), Layout::narrowed)},
      rope3, true));
  // Decoding with a KV cache: the tables [S, D] narrowed at the position offset,
  // one new token and three; the gradient reaches the narrowed rows only.
  const int64_t S = 9;
  for (const int64_t t : {int64_t(1), int64_t(3)}) {
    const int64_t start = S - t - 1;
    cs.push_back(make_case(
        "rope_tables_at_offset_t" + std::to_string(t), {Op::ROPE},
        {in("x", {B, t, H, 8}), in("cos", {S, 8}), in("sin", {S, 8})},
        [t, start](Context&, X x) {
          return rope(x[0], x[1].narrow(0, start, t), x[2].narrow(0, start, t));
        },
        true));
  }
  // Constant tables (as in the models): only x gets a gradient.
  cs.push_back(make_case(
      "rope_constant_tables", {Op::ROPE},
      {in("x", {B, T, H, 64}), constant(in("cos", {T, 64})), constant(in("sin", {T, 64}))}, rope3,
      true));
  const int64_t TM = z(64, 2048);
  cs.push_back(no_fd(make_case(
      "rope_mt", {Op::ROPE},
      {in("x", {B, TM, 8, 64}), constant(in("cos", {TM, 64})), constant(in("sin", {TM, 64}))},
      rope3, true)));
  // Per-sequence tables [B, T, D] (packed examples' positions restart; the
  // models gather rows of their tables): gradients of x and of the tables.
  cs.push_back(make_case("rope_per_sequence_tables", {Op::ROPE},
                         {in("x", {B, T, H, 12}), in("cos", {B, T, 12}),
                          with(in("sin", {B, T, 12}), Layout::permuted)},
                         rope3, true));
  // ROPE_BACK alone (no gradient rule of its own).
  cs.push_back(make_case(
      "rope_back", {Op::ROPE_BACK},
      {with(in("dy", {B, T, H, 36}), Layout::permuted), in("cos", {T, 36}), in("sin", {T, 36})},
      [](Context&, X x) {
        return detail::make_op(Op::ROPE_BACK, DType::f32, x[0].shape(), {x[0], x[1], x[2]},
                               NoParams{});
      },
      false));
}

}  // namespace

void add_attention_cases(std::vector<Case>& cs, Sz z) {
  add_attention(cs, z);
  add_attention_small(cs);
  add_attention_segments(cs);
  add_attention_dropout(cs);
  add_rope(cs, z);
}

}  // namespace kiln::test
