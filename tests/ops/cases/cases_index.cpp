// Cases: one_hot, embedding and scatter_add_rows, concat, pad, repeat and
// repeat_back. Specs check the PyTorch semantics of the public API (pad's
// last-dim-first order, repeat's tiling, concat of several tensors).
#include "kiln/ext/op_params.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

// Indices with repeats (rows that get several gradient contributions).
Gen repeated_rows(int64_t V) {
  return [V](const Shape& s, Rng& r) {
    std::vector<double> v(size_t(s.numel()));
    for (size_t k = 0; k < v.size(); ++k)
      v[k] = k % 3 == 2 ? v[k - 1] : double(r.integer(0, V - 1));
    return v;
  };
}

SpecFn embedding_spec() {
  return [](const std::vector<RefValue>& in, const RefValue& out) {
    const int64_t D = in[0].shape[1];
    Shape s = in[1].shape;
    s.push_back(D);
    RefValue w = ref_value(s, {});
    for (double i : in[1].v)
      for (int64_t d = 0; d < D; ++d) w.v.push_back(in[0].v[size_t(int64_t(i) * D + d)]);
    return spec_compare(w, out);
  };
}

void add_rows(std::vector<Case>& cs, Sz z) {
  const int64_t V = z(6, 4096), D = z(37, 256), n = z(7, 4096);
  auto emb = [](Context&, X x) { return embedding(x[0], x[1]); };
  Case e = make_case("embedding", {Op::EMBEDDING},
                     {in("weight", {V, D}), in_i32("idx", {n}, repeated_rows(V))}, emb, true);
  e.spec = embedding_spec();
  cs.push_back(e);
  Case e2 = make_case("embedding_2d_indices", {Op::EMBEDDING},
                      {in("weight", {V, D}), in_i32("idx", {2, z(3, 1024)}, repeated_rows(V))}, emb,
                      true);
  e2.spec = embedding_spec();
  cs.push_back(e2);
  Case e3 = make_case(
      "embedding_strided_table", {Op::EMBEDDING},
      {with(in("weight", {V, D}), Layout::transposed), in_i32("idx", {n}, repeated_rows(V))}, emb,
      true);
  e3.spec = embedding_spec();
  cs.push_back(e3);
  // Half-precision tables (weights kept as stored) give f32 rows (eval only).
  for (DType t : {DType::f16, DType::bf16}) {
    Case h =
        make_case(t == DType::f16 ? "embedding_f16_table" : "embedding_bf16_table", {Op::EMBEDDING},
                  {as(in("weight", {V, D}), t), in_i32("idx", {n}, repeated_rows(V))}, emb, false);
    h.spec = embedding_spec();
    cs.push_back(h);
  }
  // Quantized tables (every type of kiln/quant_types.def, frozen: eval only)
  // give each row's blocks dequantized; the reference gathers the dequantized
  // values, so the result is exact. One index (decoding) splits the row
  // between threads at block bounds; a narrowed table (rows 1..V-2) reads
  // through the view's row stride.
  for (const QuantType& qt : kQuantTypes) {
    const DType q = qt.dtype;
    const std::string qn = dtype_name(q);
    // 17 blocks of 32 (one row splits 5/6/6 over 3 threads), or 3 of 256.
    const int64_t QD = qt.block_elems == 256 ? z(768, 1024) : z(544, 1024);
    auto table = [&] { return as(in("weight", {V, QD}), q); };
    Case a = make_case("embedding_" + qn + "_table", {Op::EMBEDDING},
                       {table(), in_i32("idx", {n}, repeated_rows(V))}, emb, false);
    Case one = make_case("embedding_" + qn + "_one_row", {Op::EMBEDDING},
                         {table(), in_i32("idx", {1, 1}, repeated_rows(V))}, emb, false);
    Case two = make_case("embedding_" + qn + "_2d_indices", {Op::EMBEDDING},
                         {table(), in_i32("idx", {2, z(3, 1024)}, repeated_rows(V))}, emb, false);
    for (Case* c : {&a, &one, &two}) {
      c->spec = embedding_spec();
      c->tol = {0, 0};
      cs.push_back(*c);
    }
    Case nar = make_case(
        "embedding_" + qn + "_narrowed_table", {Op::EMBEDDING, Op::NARROW},
        {table(), in_i32("idx", {n}, repeated_rows(V - 2))},
        [V](Context&, X x) { return embedding(x[0].narrow(0, 1, V - 2), x[1]); }, false);
    nar.tol = {0, 0};
    cs.push_back(nar);
  }

  // SCATTER_ADD_ROWS directly: values [n, D] into V rows (repeated indices sum).
  auto scatter = [V](Context&, X x) {
    return detail::make_op(Op::SCATTER_ADD_ROWS, DType::f32, {V, x[0].size(-1)}, {x[0], x[1]},
                           ScatterAddRowsParams{V});
  };
  cs.push_back(make_case("scatter_add_rows", {Op::SCATTER_ADD_ROWS},
                         {in("values", {n, D}), in_i32("idx", {n}, repeated_rows(V))}, scatter,
                         true));
  cs.push_back(make_case("scatter_add_rows_strided_3d", {Op::SCATTER_ADD_ROWS},
                         {with(in("values", {2, z(3, 1024), D}), Layout::permuted),
                          in_i32("idx", {2, z(3, 1024)}, repeated_rows(V))},
                         scatter, true));
}

void add_concat(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 512);
  cs.push_back(make_case(
      "concat_dim0", {Op::CONCAT}, {in("a", {R, C}), in("b", {2, C})},
      [](Context&, X x) {
        return concat({x[0], x[1]}, 0);
      },
      true));
  cs.push_back(make_case(
      "concat_dim1", {Op::CONCAT}, {in("a", {R, C}), in("b", {R, 1})},
      [](Context&, X x) {
        return concat({x[0], x[1]}, 1);
      },
      true));
  Case three = make_case(
      "concat_three_neg_dim_3d", {Op::CONCAT},
      {in("a", {2, R, C}), in("b", {2, R, 1}), in("c", {2, R, 3})},
      [](Context&, X x) {
        return concat(std::vector<Tensor>{x[0], x[1], x[2]}, -1);
      },
      true);
  three.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const int64_t rows = in[0].shape[0] * in[0].shape[1];
    RefValue w = ref_value({in[0].shape[0], in[0].shape[1], in[0].shape[2] + 1 + 3}, {});
    for (int64_t r = 0; r < rows; ++r)
      for (const RefValue& t : in) {
        const int64_t c = t.shape[2];
        for (int64_t k = 0; k < c; ++k) w.v.push_back(t.v[size_t(r * c + k)]);
      }
    return spec_compare(w, out);
  };
  cs.push_back(three);
  cs.push_back(make_case(
      "concat_strided", {Op::CONCAT},
      {with(in("a", {R, C}), Layout::transposed), with(in("b", {R, C}), Layout::narrowed)},
      [](Context&, X x) {
        return concat({x[0], x[1]}, 0);
      },
      true));
  cs.push_back(make_case(
      "concat_dim1_4d_expanded", {Op::CONCAT},
      {in("a", {2, 1, R, C}), expanded(in("b", {2, 2, R, C}), {1, 2, R, 1})},
      [](Context&, X x) {
        return concat({x[0], x[1]}, 1);
      },
      true));
  // Seven parts, one strided and two twice: a node of six (the most sources a
  // node has), then one of that and the seventh.
  cs.push_back(make_case(
      "concat_seven_parts", {Op::CONCAT},
      {in("a", {R, 2}), with(in("b", {R, 3}), Layout::narrowed), in("c", {R, 1}), in("d", {R, 4}),
       in("e", {R, 2})},
      [](Context&, X x) {
        return concat(std::vector<Tensor>{x[0], x[1], x[2], x[3], x[4], x[0], x[2]}, 1);
      },
      true));
}

// torch.nn.functional.pad: pairs (before, after) from the last dim backwards.
SpecFn pad_spec(std::vector<int64_t> pads, double value) {
  return [pads, value](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int nd = x.shape.ndim();
    Shape s = x.shape;
    std::vector<int64_t> before(size_t(nd), 0);
    for (size_t k = 0; k + 1 < pads.size(); k += 2) {
      const int d = nd - 1 - int(k / 2);
      before[size_t(d)] = pads[k];
      s[d] += pads[k] + pads[k + 1];
    }
    RefValue w = ref_value(s, std::vector<double>(size_t(s.numel()), value));
    Index it(x.shape);
    do {
      int64_t o[kMaxDims];
      for (int d = 0; d < nd; ++d) o[d] = it.i[d] + before[size_t(d)];
      w.v[size_t(ref_linear(s, o))] = x.v[size_t(ref_linear(x.shape, it.i))];
    } while (it.next());
    return spec_compare(w, out);
  };
}

// torch.Tensor.repeat (same number of dims here).
SpecFn repeat_spec(std::vector<int64_t> reps) {
  return [reps](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    Shape s = x.shape;
    for (int d = 0; d < s.ndim(); ++d) s[d] *= reps[size_t(d)];
    RefValue w = ref_value(s, std::vector<double>(size_t(s.numel()), 0.0));
    Index it(s);
    do {
      int64_t i[kMaxDims];
      for (int d = 0; d < s.ndim(); ++d) i[d] = it.i[d] % x.shape[d];
      w.v[size_t(ref_linear(s, it.i))] = x.v[size_t(ref_linear(x.shape, i))];
    } while (it.next());
    return spec_compare(w, out);
  };
}

void add_pad_repeat(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 512);
  Case p1 = make_case(
      "pad_last_dim", {Op::PAD}, {in("x", {R, C})},
      [](Context&, X x) {
        return pad(x[0], {1, 2});
      },
      true);
  p1.spec = pad_spec({1, 2}, 0);
  cs.push_back(p1);
  Case p2 = make_case(
      "pad_two_dims_value", {Op::PAD}, {in("x", {R, C})},
      [](Context&, X x) {
        return pad(x[0], {1, 0, 2, 1}, 0.5f);
      },
      true);
  p2.spec = pad_spec({1, 0, 2, 1}, 0.5);
  cs.push_back(p2);
  Case p3 = make_case(
      "pad_3d_permuted", {Op::PAD}, {with(in("x", {2, R, C}), Layout::permuted)},
      [](Context&, X x) {
        return pad(x[0], {0, 1, 1, 0, 2, 0}, -1.0f);
      },
      true);
  p3.spec = pad_spec({0, 1, 1, 0, 2, 0}, -1);
  cs.push_back(p3);
  Case p4 = make_case(
      "pad_4d_image", {Op::PAD}, {in("x", {1, 2, R, C})},
      [](Context&, X x) {
        return pad(x[0], {2, 2, 1, 1});
      },
      true);
  p4.spec = pad_spec({2, 2, 1, 1}, 0);
  cs.push_back(p4);

  Case r1 = make_case(
      "repeat_2d", {Op::REPEAT}, {in("x", {R, C})},
      [](Context&, X x) {
        return repeat(x[0], {2, 3});
      },
      true);
  r1.spec = repeat_spec({2, 3});
  cs.push_back(r1);
  Case r2 = make_case(
      "repeat_3d_transposed", {Op::REPEAT}, {with(in("x", {2, R, C}), Layout::transposed)},
      [](Context&, X x) {
        return repeat(x[0], {2, 1, 3});
      },
      true);
  r2.spec = repeat_spec({2, 1, 3});
  cs.push_back(r2);
  Case r3 = make_case(
      "repeat_ones", {Op::REPEAT}, {with(in("x", {R, C}), Layout::narrowed)},
      [](Context&, X x) {
        return repeat(x[0], {1, 2}) * 1.0f;
      },
      true);
  r3.spec = repeat_spec({1, 2});
  cs.push_back(r3);

  // REPEAT_BACK directly: sums the tiles of shape dst.shape.
  auto back = [](Shape dst) {
    return
        [dst](Context&, X x) { return detail::make_op(Op::REPEAT_BACK, DType::f32, dst, {x[0]}); };
  };
  cs.push_back(make_case("repeat_back_2d", {Op::REPEAT_BACK}, {in("x", {2 * R, 3 * C})},
                         back({R, C}), true));
  cs.push_back(make_case("repeat_back_3d_strided", {Op::REPEAT_BACK},
                         {with(in("x", {2, 2 * R, C}), Layout::transposed)}, back({1, R, C}),
                         true));
}

void add_one_hot(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(4, 512);
  auto one_hot_spec = [](int64_t classes) {
    return [classes](const std::vector<RefValue>& in, const RefValue& out) {
      Shape s = in[0].shape;
      s.push_back(classes);
      RefValue w = ref_value(s, std::vector<double>(size_t(s.numel()), 0.0));
      for (size_t k = 0; k < in[0].v.size(); ++k) w.v[k * size_t(classes) + size_t(in[0].v[k])] = 1;
      return spec_compare(w, out);
    };
  };
  Case oh = make_case(
      "one_hot", {Op::ONE_HOT}, {in_i32("labels", {N}, gen::integers(0, 3))},
      [](Context&, X x) { return one_hot(x[0], 4); }, false);
  oh.tol = {0, 0};
  oh.spec = one_hot_spec(4);
  cs.push_back(oh);
  Case oh2 = make_case(
      "one_hot_2d_strided", {Op::ONE_HOT},
      {with(in_i32("labels", {2, z(3, 256)}, gen::integers(0, 4)), Layout::transposed)},
      [](Context&, X x) { return one_hot(x[0], 5); }, false);
  oh2.tol = {0, 0};
  oh2.spec = one_hot_spec(5);
  cs.push_back(oh2);
}

}  // namespace

// gather_last (a composite), checked against its definition; and top-k
// routing over experts as the MoE block computes it (softmax over all experts,
// the top k, renormalised): gradients flow to the router logits through the
// chosen experts' probabilities.
void add_gather_last(std::vector<Case>& cs, Sz z) {
  const int64_t N = z(4, 512), C = 6;
  Case g = make_case(
      "gather_last", {Op::ONE_HOT, Op::MUL, Op::SUM},
      {in("x", {N, C}), in_i32("idx", {N, 3}, gen::integers(0, C - 1))},
      [](Context&, X x) { return gather_last(x[0], x[1]); }, true);
  g.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const int64_t rows = in[1].shape[0], k = in[1].shape[1], c = in[0].shape[1];
    RefValue w = ref_value(in[1].shape, std::vector<double>(size_t(rows * k), 0.0));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < k; ++j)
        w.v[size_t(r * k + j)] = in[0].v[size_t(r * c + int64_t(in[1].v[size_t(r * k + j)]))];
    return spec_compare(w, out);
  };
  cs.push_back(g);
  cs.push_back(make_case(
      "moe_topk_routing", {Op::SOFTMAX, Op::TOPK, Op::ONE_HOT, Op::DIV},
      {in("logits", {N, C}, gen::distinct(-2, 2))},
      [](Context&, X x) {
        const Tensor p = softmax(x[0]);
        const Tensor w = gather_last(p, topk_indices(x[0], 2));
        return w / sum(w, -1, true);
      },
      true));
}

void add_index_cases(std::vector<Case>& cs, Sz z) {
  add_one_hot(cs, z);
  add_gather_last(cs, z);
  add_rows(cs, z);
  add_concat(cs, z);
  add_pad_repeat(cs, z);
}

}  // namespace kiln::test
