// Cases: copies (contiguous, dtype conversions), constants (full and its
// relatives), random masks and dropout.
#include <cmath>
#include <functional>

#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"
#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

// Spec: the output equals input 0 elementwise mapped by f.
SpecFn map_spec(std::function<double(double)> f) {
  return [f](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue want = in[0];
    for (double& v : want.v) v = f(v);
    return spec_compare(want, out);
  };
}

void add_copies(std::vector<Case>& cs, Sz z) {
  struct Conv {
    const char* name;
    DType from, to;
    Gen g;
  };
  // f32 -> i32 truncates toward zero (C++ / PyTorch .to(torch.int32)); values stay
  // away from integers so any rounding mode difference shows.
  const Conv convs[] = {
      {"copy_f32_f16", DType::f32, DType::f16, gen::uniform(-3, 3)},
      {"copy_f32_bf16", DType::f32, DType::bf16, gen::uniform(-3, 3)},
      {"copy_f16_f32", DType::f16, DType::f32, gen::uniform(-3, 3)},
      {"copy_bf16_f32", DType::bf16, DType::f32, gen::uniform(-3, 3)},
      {"copy_f16_bf16", DType::f16, DType::bf16, gen::uniform(-3, 3)},
      {"copy_bf16_f16", DType::bf16, DType::f16, gen::uniform(-3, 3)},
      {"copy_f32_i32", DType::f32, DType::i32, gen::uniform(-40, 40)},
      {"copy_i32_f32", DType::i32, DType::f32, gen::integers(-1000, 1000)},
      {"copy_i32_f16", DType::i32, DType::f16, gen::integers(-3000, 3000)},
      {"copy_f16_i32", DType::f16, DType::i32, gen::uniform(-40, 40)},
      {"copy_bf16_i32", DType::bf16, DType::i32, gen::uniform(-40, 40)},
      {"copy_i32_bf16", DType::i32, DType::bf16, gen::integers(-3000, 3000)},
  };
  for (const Conv& cv : convs) {
    const DType to = cv.to;
    Case c = make_case(
        cv.name, {Op::COPY}, {as(in("x", {z(3, 256), z(37, 1024)}, cv.g), cv.from)},
        [to](Context&, X x) { return x[0].to(to); }, false);
    c.tol = {0, 0};  // conversions are exact given the same rounding rule
    cs.push_back(c);
    // The same conversion from a transposed view (strided source).
    Case t = make_case(
        std::string(cv.name) + "_strided", {Op::COPY, Op::PERMUTE},
        {with(as(in("x", {z(37, 256), z(3, 1024)}, cv.g), cv.from), Layout::transposed)},
        [to](Context&, X x) { return x[0].to(to); }, false);
    t.tol = {0, 0};
    cs.push_back(t);
  }
  // Quantized tensors: dequantize (q -> f32, exact) and quantize (f32 -> q, rows
  // of blocks; the reference quantizes with ggml's formulas, exact too), also
  // from a transposed f32 source.
  for (DType q : {DType::q8_0, DType::q4_0}) {
    const std::string qn = dtype_name(q);
    Case deq = make_case(
        "copy_" + qn + "_f32", {Op::COPY}, {as(in("w", {z(3, 256), z(64, 1024)}), q)},
        [](Context&, X x) { return x[0].to(f32); }, false);
    deq.tol = {0, 0};
    cs.push_back(deq);
    Case qz = make_case(
        "copy_f32_" + qn, {Op::COPY}, {in("x", {z(3, 256), z(64, 1024)})},
        [q](Context&, X x) { return x[0].to(q); }, false);
    qz.tol = {0, 0};
    cs.push_back(qz);
    Case qt = make_case(
        "copy_f32_" + qn + "_strided", {Op::COPY, Op::PERMUTE},
        {with(in("x", {z(3, 256), z(64, 1024)}), Layout::transposed)},
        [q](Context&, X x) { return x[0].to(q); }, false);
    qt.tol = {0, 0};
    cs.push_back(qt);
  }

  // f32 -> i32 truncation toward zero, checked against the API promise directly.
  for (Case& c : cs)
    if (c.name == "copy_f32_i32") c.spec = map_spec([](double v) { return std::trunc(v); });

  // contiguous() of views: COPY with a backward rule.
  cs.push_back(make_case(
      "contiguous_of_transposed", {Op::COPY, Op::PERMUTE},
      {with(in("x", {z(3, 256), z(37, 1024)}), Layout::transposed)},
      [](Context&, X x) { return x[0].contiguous(); }, true));
  cs.push_back(make_case(
      "contiguous_of_narrowed", {Op::COPY, Op::NARROW},
      {with(in("x", {z(37, 256), z(3, 1024)}), Layout::narrowed)},
      [](Context&, X x) { return x[0].contiguous() * 2.0f; }, true));
  cs.push_back(make_case(
      "contiguous_of_expanded", {Op::COPY, Op::EXPAND},
      {expanded(in("x", {z(3, 256), z(37, 1024)}), {z(3, 256), 1})},
      [](Context&, X x) { return x[0].contiguous(); }, true));
}

void add_const_cases(std::vector<Case>& cs, Sz z) {
  const int64_t r = z(3, 512), c = z(37, 1024);
  Case fill = make_case(
      "full_plus_x", {Op::FULL, Op::ADD}, {in("x", {r, c})},
      [r, c](Context& ctx, X x) {
        return x[0] + full(ctx, {r, c}, 2.5f);
      },
      true);
  fill.spec = map_spec([](double v) { return v + 2.5; });
  cs.push_back(fill);
  Case like = make_case(
      "full_like_times_x", {Op::FULL, Op::MUL}, {in("x", {r, c})},
      [](Context&, X x) { return x[0] * full_like(x[0], -3.0f) + ones(x[0].ctx(), {1}); }, true);
  like.spec = map_spec([](double v) { return -3.0 * v + 1.0; });
  cs.push_back(like);
  Case zero = make_case(
      "zeros_plus_x", {Op::FULL}, {in("x", {r, c})},
      [r, c](Context& ctx, X x) {
        return zeros(ctx, {r, c}) + x[0];
      },
      true);
  zero.spec = map_spec([](double v) { return v; });
  cs.push_back(zero);
  Case fi = make_case(
      "full_i32", {Op::FULL}, {},
      [r, c](Context& ctx, X) {
        return full(ctx, {r, c}, 7.0f, DType::i32);
      },
      false);
  fi.spec = [r, c](const std::vector<RefValue>&, const RefValue& out) {
    if (out.dtype != DType::i32) return std::string("full(.., i32) is not i32");
    return spec_compare(ref_value({r, c}, std::vector<double>(size_t(r * c), 7.0)), out);
  };
  cs.push_back(fi);
}

// Fraction of zeros in v within [lo, hi] and every kept element == x * s.
std::string dropout_spec(const RefValue& x, const RefValue& out, double p) {
  size_t zeros = 0;
  for (size_t k = 0; k < out.v.size(); ++k) {
    if (out.v[k] == 0) {
      ++zeros;
    } else if (std::fabs(out.v[k] - x.v[k] / (1 - p)) > 1e-6 * std::fabs(x.v[k] / (1 - p))) {
      return "dropout: kept element " + std::to_string(k) + " is not x / (1 - p)";
    }
  }
  const double frac = double(zeros) / double(out.v.size());
  if (std::fabs(frac - p) > 0.15)
    return "dropout: " + std::to_string(frac) +
           " of the elements are zero, p = " + std::to_string(p);
  return {};
}

void add_random_cases(std::vector<Case>& cs, Sz z) {
  const int64_t r = z(8, 512), c = z(37, 1024);
  // RAND_MASK directly.
  // A src-less RAND_MASK (make_op needs a source to find the context).
  Case mask = make_case(
      "rand_mask", {Op::RAND_MASK}, {},
      [r, c](Context& ctx, X) {
        TensorNode* n = ctx.new_node(DType::f32, {r, c}, Op::RAND_MASK);
        detail::set_params(*n, RandMaskParams{12345, 0.3f});
        return Tensor(n);
      },
      false);
  mask.tol = {0, 0};
  mask.spec = [](const std::vector<RefValue>&, const RefValue& out) {
    double ones = 0;
    for (double v : out.v) ones += v;
    const double frac = ones / double(out.v.size());
    return std::fabs(frac - 0.3) < 0.12 ? std::string()
                                        : "rand_mask: " + std::to_string(frac) + " ones, want ~0.3";
  };
  cs.push_back(mask);
  Case seeded = make_case(
      "rand_mask_seed_tensor", {Op::RAND_MASK}, {in_i32("seed", {1}, gen::integers(1, 1000000))},
      [r, c](Context&, X x) {
        return detail::make_op(Op::RAND_MASK, DType::f32, {r, c}, {x[0]}, RandMaskParams{99, 0.6f});
      },
      false);
  seeded.tol = {0, 0};
  cs.push_back(seeded);

  const float p = 0.25f;
  Case train = make_case(
      "dropout_train", {Op::RAND_MASK, Op::MUL}, {in("x", {r, c}, gen::magnitude(0.5, 2))},
      [p](Context&, X x) { return dropout(x[0], p, 42, true); }, true);
  train.spec = [p](const std::vector<RefValue>& in, const RefValue& out) {
    return dropout_spec(in[0], out, p);
  };
  cs.push_back(train);
  Case st = make_case(
      "dropout_seed_tensor", {Op::RAND_MASK},
      {in("x", {r, c}, gen::magnitude(0.5, 2)), in_i32("seed", {1}, gen::integers(1, 1 << 20))},
      [](Context&, X x) { return dropout(x[0], 0.5f, 7, true, x[1]); }, true);
  st.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    return dropout_spec(in[0], out, 0.5);
  };
  cs.push_back(st);
  Case off = make_case(
      "dropout_not_training", {}, {in("x", {r, c})},
      [](Context&, X x) { return dropout(x[0], 0.5f, 7, false) * 1.0f; }, true);
  off.spec = map_spec([](double v) { return v; });
  cs.push_back(off);
}
}  // namespace

void add_copy_cases(std::vector<Case>& cs, Sz z) {
  add_copies(cs, z);
  add_const_cases(cs, z);
  add_random_cases(cs, z);
}

}  // namespace kiln::test
