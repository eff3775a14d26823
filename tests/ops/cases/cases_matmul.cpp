// Cases: matmul (2-D, batched, broadcast batch dims, transposed / narrowed /
// expanded views, odd sizes, f16 / bf16 operands); expert_matmul and its
// weight gradient (mixture of experts).
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

Tensor mm(Context&, X x) { return matmul(x[0], x[1]); }

Tensor em(Context&, X x) { return expert_matmul(x[0], x[1], x[2]); }

// expert_matmul (mixture of experts): groups of one row (decoding), of a few
// rows (dot products per row) and of many rows (gathered, one GEMM), x [N, K]
// and [N, k, K], w f32 / strided / bf16 / quantized, and experts no row chose
// (their weight gradient is 0). Ids are fixed lists so every path is taken.
void add_expert_matmul_cases(std::vector<Case>& cs, Sz z) {
  const int64_t E = 6, M = z(5, 512), K = z(7, 512);
  // 4 tokens x 2 experts, rows (0,3) (3,1) (5,3) (0,1): expert 3 chosen by
  // three rows, 0 and 1 by two, 5 by one, 2 and 4 by none.
  const Gen few = gen::values({0, 3, 3, 1, 5, 3, 0, 1});
  auto mk = [&](const std::string& name, Input x, Input w, Input ids, bool grad) {
    Case c = make_case(name, {Op::EXPERT_MATMUL}, {x, w, ids}, em, grad);
    c.tol = {1e-5, 1e-5};
    return c;
  };
  cs.push_back(
      mk("expert_matmul", in("x", {4, K}), in("w", {E, M, K}), in_i32("ids", {4, 2}, few), true));
  cs.push_back(mk("expert_matmul_x_per_expert", in("x", {4, 2, K}), in("w", {E, M, K}),
                  in_i32("ids", {4, 2}, few), true));
  cs.push_back(mk("expert_matmul_decode", in("x", {1, z(9, 2048)}),
                  in("w", {E, z(70, 1024), z(9, 2048)}), in_i32("ids", {1, 2}, gen::values({4, 1})),
                  true));
  // w as a permuted view (no unit stride along K): the gathered GEMM path.
  cs.push_back(mk("expert_matmul_w_permuted", in("x", {4, K}),
                  with(in("w", {E, M, K}), Layout::permuted), in_i32("ids", {4, 2}, few), true));
  cs.push_back(mk("expert_matmul_x_transposed", with(in("x", {4, K}), Layout::transposed),
                  in("w", {E, M, K}), in_i32("ids", {4, 2}, few), true));
  // 24 rows over 3 experts: 12 (gathered rows, one GEMM per block), 8 and 4
  // (dot products); M past one row block (64) with a partial block.
  const Gen many_ids = gen::values({0, 1, 0, 2, 0, 1});
  Case many = mk("expert_matmul_many_rows", in("x", {12, z(20, 256)}),
                 in("w", {3, z(70, 300), z(20, 256)}), in_i32("ids", {12, 2}, many_ids), true);
  many.fd = false;
  cs.push_back(many);
  Case bf = mk("expert_matmul_bf16_w", in("x", {4, K}), as(in("w", {E, M, K}), DType::bf16),
               in_i32("ids", {4, 2}, few), false);
  cs.push_back(bf);
  Case bfm = mk("expert_matmul_bf16_w_many_rows", in("x", {12, 2, z(20, 256)}),
                as(in("w", {3, z(70, 300), z(20, 256)}), DType::bf16),
                in_i32("ids", {12, 2}, many_ids), false);
  bfm.tol = {1e-5, 1e-4};
  cs.push_back(bfm);
  // Quantized experts (as GGUF's ffn_*_exps): x @ W_e^T read as stored, one row
  // (in place) and several (gathered); the x gradient runs the dy @ W kernel on
  // the transposed view. Tolerances as the quantized matmul's (rounded x rows
  // on the decoding paths).
  for (DType q : {DType::q8_0, DType::q4_0, DType::q4_k}) {
    const std::string qn = dtype_name(q);
    const int64_t QK = dtype_block_elems(q) == 256 ? 256 : 64;
    Case c = make_case("expert_matmul_" + qn, {Op::EXPERT_MATMUL},
                       {in("x", {4, QK}), as(in("w", {E, M, QK}), q), in_i32("ids", {4, 2}, few)},
                       em, true);
    c.tol = {3e-2, 1e-2};
    cs.push_back(c);
    Case t = make_case(
        "expert_matmul_" + qn + "_transposed_w", {Op::EXPERT_MATMUL, Op::PERMUTE},
        {in("x", {4, 2, z(3, 8)}), as(in("w", {E, z(3, 8), QK}), q), in_i32("ids", {4, 2}, few)},
        [](Context&, X x) {
          return expert_matmul(x[0], x[1].permute({0, 2, 1}), x[2]);
        },
        false);
    t.tol = {1e-5, 1e-4};
    cs.push_back(t);
  }
  // The weight gradient's op on its own: dw [E, M, K] (experts 2 and 4 unchosen).
  auto back_w = [E](Context&, X x) {
    return detail::make_op(Op::EXPERT_MATMUL_BACK_WEIGHT, DType::f32,
                           Shape{E, x[0].size(2), x[1].size(-1)}, {x[0], x[1], x[2]});
  };
  cs.push_back(make_case("expert_matmul_back_weight", {Op::EXPERT_MATMUL_BACK_WEIGHT},
                         {in("dy", {4, 2, M}), in("x", {4, K}), in_i32("ids", {4, 2}, few)}, back_w,
                         false));
  cs.push_back(
      make_case("expert_matmul_back_weight_x_per_expert", {Op::EXPERT_MATMUL_BACK_WEIGHT},
                {in("dy", {4, 2, z(70, 300)}), in("x", {4, 2, K}), in_i32("ids", {4, 2}, few)},
                back_w, false));
}

}  // namespace

void add_matmul_cases(std::vector<Case>& cs, Sz z) {
  const int64_t M = z(3, 256), K = z(4, 256), N = z(5, 256);
  const Gen g = gen::uniform(-1, 1);
  auto mk = [&](const char* name, Input a, Input b, bool grad) {
    Case c = make_case(name, {Op::MATMUL}, {a, b}, mm, grad);
    c.tol = {1e-5, 1e-5};
    return c;
  };
  cs.push_back(mk("matmul", in("a", {M, K}), in("b", {K, N}), true));
  cs.push_back(mk("matmul_batched", in("a", {2, M, K}), in("b", {2, K, N}), true));
  cs.push_back(mk("matmul_bcast_b", in("a", {2, M, K}), in("b", {K, N}), true));
  cs.push_back(mk("matmul_bcast_a", in("a", {M, K}), in("b", {2, K, N}), true));
  cs.push_back(mk("matmul_bcast_4d", in("a", {2, 1, M, K}), in("b", {3, K, N}), true));
  cs.push_back(mk("matmul_bcast_size1_batch", in("a", {1, M, K}), in("b", {2, K, N}), true));
  cs.push_back(
      mk("matmul_a_transposed", with(in("a", {M, K}), Layout::transposed), in("b", {K, N}), true));
  cs.push_back(
      mk("matmul_b_transposed", in("a", {M, K}), with(in("b", {K, N}), Layout::transposed), true));
  cs.push_back(mk("matmul_both_transposed_batched", with(in("a", {2, M, K}), Layout::transposed),
                  with(in("b", {2, K, N}), Layout::transposed), true));
  cs.push_back(
      mk("matmul_a_narrowed", with(in("a", {M, K}), Layout::narrowed), in("b", {K, N}), true));
  cs.push_back(mk("matmul_b_permuted_3d", in("a", {2, M, K}),
                  with(in("b", {2, K, N}), Layout::permuted), true));
  cs.push_back(mk("matmul_b_expanded_batch", in("a", {2, M, K}),
                  expanded(in("b", {2, K, N}), {1, K, N}), true));
  cs.push_back(mk("matmul_row_vector", in("a", {1, z(7, 1024)}), in("b", {z(7, 1024), N}), true));
  // One row times a transposed matrix (x @ W^T, batch-1 decoding): computed as W x^T.
  cs.push_back(mk("matmul_row_times_b_transposed", in("a", {2, 1, z(7, 576)}),
                  with(in("b", {2, z(7, 576), z(9, 1728)}), Layout::transposed), true));
  cs.push_back(mk("matmul_col_vector", in("a", {M, z(7, 1024)}), in("b", {z(7, 1024), 1}), true));
  cs.push_back(mk("matmul_k1_outer", in("a", {M, 1}), in("b", {1, N}), true));
  // Sizes that are no multiple of any vector width or block size.
  cs.push_back(mk("matmul_odd_sizes", in("a", {z(7, 257), z(13, 263)}),
                  in("b", {z(13, 263), z(9, 129)}), true));
  cs.push_back(mk("matmul_odd_sizes_transposed",
                  with(in("a", {z(11, 255), z(17, 127)}), Layout::transposed),
                  with(in("b", {z(17, 127), z(6, 65)}), Layout::transposed), false));
  // Past the GEMM's blocking: several K blocks (KC = 256), partial MR x NR edge
  // tiles, several column strips; transposed and batched variants (eval only).
  auto blocked = [&](const char* name, Input a, Input b) {
    Case c = mk(name, a, b, false);
    c.tol = {1e-5, 1e-4};
    cs.push_back(c);
  };
  blocked("matmul_blocked", in("a", {z(33, 512), z(300, 512)}), in("b", {z(300, 512), z(70, 512)}));
  blocked("matmul_blocked_transposed_batched",
          with(in("a", {2, z(29, 256), z(270, 512)}), Layout::transposed),
          in("b", {z(270, 512), z(45, 256)}));
  blocked("matmul_blocked_b_transposed", in("a", {z(17, 512), z(513, 1024)}),
          with(in("b", {z(513, 1024), z(40, 512)}), Layout::transposed));
  blocked("matmul_blocked_f16", as(in("a", {2, z(20, 256), z(300, 512)}), DType::f16),
          as(in("b", {z(300, 512), z(40, 256)}), DType::f16));
  blocked("matmul_blocked_bf16_transposed",
          with(as(in("a", {z(30, 256), z(260, 512)}), DType::bf16), Layout::transposed),
          with(as(in("b", {z(260, 512), z(33, 256)}), DType::bf16), Layout::transposed));
  // Many small batched products (dealt out whole to threads).
  blocked("matmul_many_small", in("a", {4, 3, z(5, 64), z(6, 64)}),
          in("b", {3, z(6, 64), z(7, 64)}));
  cs.push_back(mk("matmul_medium", in("a", {z(15, 512), z(20, 512)}),
                  in("b", {z(20, 512), z(33, 512)}), true));
  Case big = mk("matmul_larger_k", in("a", {z(5, 128), z(70, 2048)}),
                in("b", {z(70, 2048), z(6, 128)}), false);
  big.tol = {1e-5, 1e-4};
  cs.push_back(big);

  // A quantized weight (every type of kiln/quant_types.def) read as stored:
  // x @ W^T (W.T(), a Linear's forward; the gradient with respect to x is
  // dy @ W, the other kernel) and dy @ W directly. The reference multiplies the
  // dequantized weights in double, so with more than 4 rows of x the error is
  // f32 accumulation only; W is an input, never trained. With 1-4 rows
  // (decoding) the k-quants always, the 32-value formats on AVX2 builds and
  // Q8_0 / Q4_0 on AVX512_VNNI builds round x to 8-bit blocks first
  // (qmatmul.h, qmatmul_xwt_rounds_x): each output then moves by at
  // most sum |W| * (max |x| of a block / 127) / 2, under 0.13 at K = 64 (0.5
  // at K = 256) for these inputs of magnitude <= 1 and ~50x less typically;
  // `few` cases get that tolerance (exact paths pass it trivially, a wrong
  // block or scale does not). Rows are 64 values (2 blocks) or, for the
  // k-quants, 256 (one block).
  for (const QuantType& qt : kQuantTypes) {
    const DType q = qt.dtype;
    const std::string qn = dtype_name(q);
    const int64_t QK = qt.block_elems == 256 ? z(256, 1024) : z(64, 512);
    const int64_t QN = z(5, 256), QM = z(6, 256);  // QM > 4: exact path
    auto w = [&](Shape s, Layout l) { return with(as(in("w", s, g), q), l); };
    auto add = [&](const std::string& name, Input a, Input b, bool grad, bool few = false) {
      Case c = make_case("matmul_" + qn + name, {Op::MATMUL}, {a, b}, mm, grad);
      c.tol = few ? Tol{3e-2, 1e-2} : Tol{1e-5, 1e-4};
      cs.push_back(c);
    };
    add("_xwt", in("x", {QM, QK}), w({QK, QN}, Layout::transposed), true);
    add("_xwt_few", in("x", {3, QK}), w({QK, QN}, Layout::transposed), false, true);
    // (finite differences over 2 x 9 x 256 inputs take seconds: the k-quants'
    // x gradient is checked by _xwt and _xw)
    add("_xwt_batched", in("x", {2, z(9, 64), QK}), w({QK, QN}, Layout::transposed),
        qt.block_elems == 32);
    add("_xwt_row", in("x", {1, QK}), w({QK, z(40, 512)}, Layout::transposed), false, true);
    add("_xw", in("dy", {z(9, 256), QN}), w({QN, QK}, Layout::contig), true);
    add("_xw_row", in("dy", {2, 1, QN}), w({QN, QK}, Layout::contig), false);
    add("_xwt_x_transposed", with(in("x", {QM, QK}), Layout::transposed),
        w({QK, QN}, Layout::transposed), false);
  }

  // Half-precision operands (eval only: FD through f16 rounding is meaningless).
  // Inputs are exact f16/bf16 values and the result is f32, so the error is only
  // f32 accumulation.
  struct Half {
    const char* name;
    DType ta, tb;
    Layout la, lb;
  };
  const Half halves[] = {
      {"matmul_f16", DType::f16, DType::f16, Layout::contig, Layout::contig},
      {"matmul_bf16", DType::bf16, DType::bf16, Layout::contig, Layout::contig},
      {"matmul_f16_f32", DType::f16, DType::f32, Layout::contig, Layout::contig},
      {"matmul_f32_bf16", DType::f32, DType::bf16, Layout::contig, Layout::contig},
      {"matmul_f16_transposed", DType::f16, DType::f16, Layout::transposed, Layout::transposed},
      {"matmul_bf16_b_transposed", DType::bf16, DType::bf16, Layout::contig, Layout::transposed},
  };
  for (const Half& h : halves) {
    Case c = mk(h.name, with(as(in("a", {2, M, z(12, 256)}, g), h.ta), h.la),
                with(as(in("b", {z(12, 256), N}, g), h.tb), h.lb), false);
    c.tol = {1e-5, 1e-4};
    cs.push_back(c);
  }
  // bf16 x bf16 products big enough for the blocked GEMM, which on AVX512_BF16
  // builds packs k in pairs and runs vdpbf16ps (gemm_internal.h): odd K (a zero
  // partner), several K blocks (KC_BF16 = 512), edge tiles, every packing branch
  // (row-major, transposed, narrowed, permuted, expanded), batch broadcast. The
  // reference multiplies the stored bf16 values in double; bf16 x bf16 products
  // are exact in f32, so the error is f32 accumulation only and f32's tolerances
  // apply (rounding the inputs to bf16 is the caller's cast, not the kernel's).
  auto bf = [&](Input x, Layout l = Layout::contig) { return with(as(x, DType::bf16), l); };
  blocked("matmul_bf16_odd_k", bf(in("a", {2, z(19, 257), z(33, 263)})),
          bf(in("b", {z(33, 263), z(21, 129)})));
  blocked("matmul_bf16_long_k_b_transposed", bf(in("a", {z(40, 256), z(1100, 2048)})),
          bf(in("b", {z(1100, 2048), z(45, 256)}), Layout::transposed));
  blocked("matmul_bf16_both_transposed_bcast",
          bf(in("a", {2, 1, z(17, 255), z(35, 127)}), Layout::transposed),
          bf(in("b", {3, z(35, 127), z(30, 65)}), Layout::transposed));
  blocked("matmul_bf16_narrowed_permuted",
          bf(in("a", {2, z(23, 128), z(64, 200)}), Layout::narrowed),
          bf(in("b", {2, z(64, 200), z(33, 96)}), Layout::permuted));
  blocked(
      "matmul_bf16_expanded_batch", bf(in("a", {2, z(18, 128), z(31, 300)})),
      expanded(as(in("b", {2, z(31, 300), z(40, 100)}), DType::bf16), {1, z(31, 300), z(40, 100)}));
  // The context's bf16 matmul precision: f32 operands cast in the graph (w.T()
  // through its source, then viewed transposed), bf16 x bf16 products (eval only).
  Case policy = make_case(
      "matmul_bf16_precision_policy", {Op::MATMUL, Op::COPY},
      {in("a", {2, z(21, 256), z(45, 512)}), in("w", {z(34, 256), z(45, 512)})},
      [](Context& ctx, X x) {
        ctx.set_matmul_precision(bf16);
        return matmul(x[0], x[1].T());
      },
      false);
  policy.tol = {1e-5, 1e-4};
  cs.push_back(policy);
  // f32 params converted to f16 inside the graph, then matmul (eval only).
  Case conv = make_case(
      "matmul_of_f16_copies", {Op::MATMUL, Op::COPY}, {in("a", {M, K}), in("b", {K, N})},
      [](Context&, X x) { return matmul(x[0].to(DType::f16), x[1].to(DType::bf16)); }, false);
  conv.tol = {1e-5, 1e-4};
  cs.push_back(conv);
  // A small MLP layer: matmul + bias + relu (the composition training uses).
  add_expert_matmul_cases(cs, z);
  cs.push_back(make_case(
      "linear_relu", {Op::MATMUL, Op::ADD, Op::RELU},
      {in("x", {M, K}), in("w", {N, K}), in("b", {N}, gen::uniform(0.5, 1))},
      [](Context&, X x) { return relu(matmul(x[0], x[1].T()) + x[2]); }, true));
}

}  // namespace kiln::test
