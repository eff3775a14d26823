// Cases: the fused LAYER_NORM and RMS_NORM (affine or not, strided, D with
// vector tails) and their backward kernels on their own, and layer_norm /
// rms_norm checked against independent specs.
#include <cmath>
#include <string>

#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

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
  // With the gradient it is summed with added (has_residual,
  // Graph::fuse_norm_residual): contiguous, and a transposed one read by rows.
  for (const bool w : {false, true}) {
    const LayerNormParams p{1e-5f, w, false, true};
    std::vector<Input> ins = {in("dy", {R, D}), in("x", {R, D}, gen::uniform(-2, 2))};
    if (w) ins.push_back(in("w", {D}, wg));
    ins.push_back(w ? with(in("r", {R, D}), Layout::transposed) : in("r", {R, D}));
    cs.push_back(make_case(
        w ? "layer_norm_back_weight_residual" : "layer_norm_back_residual", {Op::LAYER_NORM_BACK},
        ins,
        [p, w](Context&, X x) {
          return detail::make_op(Op::LAYER_NORM_BACK, DType::f32, x[1].shape(),
                                 {x[0], x[1], x[2], w ? x[3] : Tensor()}, p);
        },
        false));
  }
  // Strided rows (converted into scratch) in several blocks of rows and a partial
  // one (the kernels take rows' statistics a block at a time).
  const int64_t RB = z(41, 768);
  cs.push_back(
      make_case("layer_norm_fused_strided_blocks", {Op::LAYER_NORM},
                {with(in("x", {RB, D}), Layout::transposed), in("w", {D}, wg), in("b", {D})},
                ln(true, true, 1e-5f), false));
  cs.push_back(make_case(
      "layer_norm_back_strided_blocks", {Op::LAYER_NORM_BACK},
      {with(in("dy", {RB, D}), Layout::transposed),
       with(in("x", {RB, D}, gen::uniform(-2, 2)), Layout::transposed), in("w", {D}, wg)},
      [](Context&, X x) {
        return detail::make_op(Op::LAYER_NORM_BACK, DType::f32, x[1].shape(), {x[0], x[1], x[2]},
                               LayerNormParams{1e-5f, true, false});
      },
      false));
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

void add_rms_norm(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(5, 768), D = z(37, 576);
  const Gen wg = gen::uniform(0.5, 1.5);
  auto rms = [](bool w, float eps) {
    return [=](Context&, X x) { return rms_norm(x[0], w ? x[1] : Tensor(), eps); };
  };
  cs.push_back(make_case("rms_norm_fused", {Op::RMS_NORM}, {in("x", {R, D}, gen::uniform(-2, 2))},
                         rms(false, 1e-6f), true));
  cs.push_back(make_case("rms_norm_fused_weight", {Op::RMS_NORM},
                         {in("x", {R, D}), in("w", {D}, wg)}, rms(true, 1e-5f), true));
  cs.push_back(make_case("rms_norm_fused_3d_transposed", {Op::RMS_NORM},
                         {with(in("x", {2, R, D}), Layout::transposed), in("w", {D}, wg)},
                         rms(true, 1e-2f), true));
  // D a multiple of the vector width (no tail) and below it.
  for (const int64_t d : {int64_t(32), int64_t(5)})
    cs.push_back(make_case("rms_norm_fused_d" + std::to_string(d), {Op::RMS_NORM},
                           {in("x", {3, R, d}), in("w", {d}, wg)}, rms(true, 1e-6f), true));
  const int64_t RM = z(300, 3072), DM = z(67, 576);
  cs.push_back(no_fd(make_case("rms_norm_fused_mt", {Op::RMS_NORM},
                               {in("x", {RM, DM}), in("w", {DM}, wg)}, rms(true, 1e-6f), true)));

  // The backward kernels on their own (no gradient rules of their own).
  for (const bool w : {false, true}) {
    const RmsNormParams p{1e-5f, w};
    std::vector<Input> ins = {in("dy", {R, D}), in("x", {R, D}, gen::uniform(-2, 2))};
    if (w) ins.push_back(in("w", {D}, wg));
    cs.push_back(make_case(
        w ? "rms_norm_back_weight_src" : "rms_norm_back", {Op::RMS_NORM_BACK}, ins,
        [p, w](Context&, X x) {
          return detail::make_op(Op::RMS_NORM_BACK, DType::f32, x[1].shape(),
                                 {x[0], x[1], w ? x[2] : Tensor()}, p);
        },
        false));
  }
  // With the gradient it is summed with added (has_residual): contiguous, and
  // a transposed one read by rows.
  for (const bool w : {false, true}) {
    const RmsNormParams p{1e-5f, w, true};
    std::vector<Input> ins = {in("dy", {R, D}), in("x", {R, D}, gen::uniform(-2, 2))};
    if (w) ins.push_back(in("w", {D}, wg));
    ins.push_back(w ? with(in("r", {R, D}), Layout::transposed) : in("r", {R, D}));
    cs.push_back(make_case(
        w ? "rms_norm_back_weight_residual" : "rms_norm_back_residual", {Op::RMS_NORM_BACK}, ins,
        [p, w](Context&, X x) {
          return detail::make_op(Op::RMS_NORM_BACK, DType::f32, x[1].shape(),
                                 {x[0], x[1], x[2], w ? x[3] : Tensor()}, p);
        },
        false));
  }
  for (const int64_t rows : {R, RM}) {
    Case c = make_case(
        rows == R ? "rms_norm_back_weight" : "rms_norm_back_weight_mt", {Op::RMS_NORM_BACK_WEIGHT},
        {with(in("dy", {rows, D}), Layout::transposed), in("x", {rows, D}, gen::uniform(-2, 2))},
        [D](Context&, X x) {
          return detail::make_op(Op::RMS_NORM_BACK_WEIGHT, DType::f32, Shape{D}, {x[0], x[1]},
                                 RmsNormParams{1e-6f, true});
        },
        false);
    c.tol = {2e-5, 2e-5};  // sums over up to 3072 rows
    cs.push_back(c);
  }
}

// (x - mean) / sqrt(var + eps) [* w] [+ b] over the last dim, biased variance;
// rms: x / sqrt(mean(x^2) + eps) [* w].
SpecFn norm_spec(bool rms, bool has_w, bool has_b, double eps) {
  return [=](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int64_t D = x.shape[x.shape.ndim() - 1];
    RefValue w = x;
    for (size_t r0 = 0; r0 < x.v.size(); r0 += size_t(D)) {
      double mean = 0, var = 0;
      for (int64_t d = 0; d < D; ++d) mean += x.v[r0 + size_t(d)] / double(D);
      if (rms) mean = 0;
      for (int64_t d = 0; d < D; ++d)
        var += (x.v[r0 + size_t(d)] - mean) * (x.v[r0 + size_t(d)] - mean) / double(D);
      for (int64_t d = 0; d < D; ++d) {
        double v = (x.v[r0 + size_t(d)] - mean) / std::sqrt(var + eps);
        if (has_w) v *= in[1].v[size_t(d)];
        if (has_b) v += in[has_w ? 2 : 1].v[size_t(d)];
        w.v[r0 + size_t(d)] = v;
      }
    }
    return spec_compare(w, out);
  };
}

void add_norms(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 512), D = z(37, 1024);
  const Gen wg = gen::uniform(0.5, 1.5);
  const double e5 = double(1e-5f), e6 = double(1e-6f);
  struct Nm {
    const char* name;
    std::vector<Input> ins;
    bool rms, w, b;
    float eps;
  };
  const Nm nms[] = {
      {"layer_norm", {in("x", {R, D}, gen::uniform(-2, 2))}, false, false, false, 0},
      {"layer_norm_affine",
       {in("x", {R, D}), in("w", {D}, wg), in("b", {D})},
       false,
       true,
       true,
       0},
      {"layer_norm_weight_only", {in("x", {R, D}), in("w", {D}, wg)}, false, true, false, 0},
      {"layer_norm_3d_transposed_eps",
       {with(in("x", {2, R, D}), Layout::transposed), in("w", {D}, wg), in("b", {D})},
       false,
       true,
       true,
       1e-2f},
      {"rms_norm", {in("x", {R, D}, gen::uniform(-2, 2))}, true, false, false, 0},
      {"rms_norm_weight", {in("x", {R, D}), in("w", {D}, wg)}, true, true, false, 0},
      {"rms_norm_3d_narrowed_eps",
       {with(in("x", {2, R, D}), Layout::narrowed), in("w", {D}, wg)},
       true,
       true,
       false,
       1e-2f},
  };
  for (const Nm& n : nms) {
    const bool rms = n.rms, hw = n.w, hb = n.b;
    const float eps = n.eps;
    auto build = [=](Context&, X x) {
      Tensor w = hw ? x[1] : Tensor(), b = hb ? x[2] : Tensor();
      if (rms) return eps > 0 ? rms_norm(x[0], w, eps) : rms_norm(x[0], w);
      return eps > 0 ? layer_norm(x[0], w, b, eps) : layer_norm(x[0], w, b);
    };
    Case c = make_case(n.name, {}, n.ins, build, true);
    c.spec = norm_spec(rms, hw, hb, eps > 0 ? double(eps) : rms ? e6 : e5);
    cs.push_back(c);
  }
}
}  // namespace

void add_norm_cases(std::vector<Case>& cs, Sz z) {
  add_layer_norm(cs, z);
  add_rms_norm(cs, z);
  add_norms(cs, z);
}

}  // namespace kiln::test
