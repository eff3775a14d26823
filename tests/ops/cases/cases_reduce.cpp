// Cases: sum / mean / max over all elements and along axes (keepdim or not,
// strided sources), sum_to, argmax (first max wins), count_equal.
#include <cmath>

#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

// Spec for mean over `axis` (-1: all) of a 2-D or 3-D input.
SpecFn mean_spec(int axis, bool keepdim) {
  return [axis, keepdim](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    Shape s;
    for (int d = 0; d < x.shape.ndim(); ++d) {
      if (axis == -1 || d == axis) {
        if (keepdim) s.push_back(1);
      } else {
        s.push_back(x.shape[d]);
      }
    }
    RefValue w = ref_value(s, std::vector<double>(size_t(s.numel()), 0.0));
    const double n = axis == -1 ? double(x.numel()) : double(x.shape[axis]);
    Index it(x.shape);
    do {
      int64_t o = 0;
      for (int d = 0; d < x.shape.ndim(); ++d)
        if (axis != -1 && d != axis) o = o * x.shape[d] + it.i[d];
      w.v[size_t(o)] += x.v[size_t(ref_linear(x.shape, it.i))] / n;
    } while (it.next());
    return spec_compare(w, out);
  };
}

void add_sum(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(4, 512), C = z(37, 1024);
  struct Red {
    const char* name;
    std::function<Tensor(Tensor)> f;
    Input x;
  };
  const Red reds[] = {
      {"sum_all", [](Tensor x) { return sum(x); }, in("x", {R, C})},
      {"sum_axis0", [](Tensor x) { return sum(x, 0); }, in("x", {R, C})},
      {"sum_axis1_keepdim", [](Tensor x) { return sum(x, 1, true); }, in("x", {R, C})},
      {"sum_axis_neg1_3d", [](Tensor x) { return sum(x, -1); }, in("x", {2, R, C})},
      {"sum_axis1_3d_keepdim", [](Tensor x) { return sum(x, 1, true); }, in("x", {2, R, C})},
      {"sum_axis0_transposed", [](Tensor x) { return sum(x, 0); },
       with(in("x", {R, C}), Layout::transposed)},
      {"sum_axis1_narrowed", [](Tensor x) { return sum(x, 1); },
       with(in("x", {R, C}), Layout::narrowed)},
      {"sum_all_permuted_3d", [](Tensor x) { return sum(x); },
       with(in("x", {2, R, C}), Layout::permuted)},
      {"sum_axis0_expanded", [](Tensor x) { return sum(x, 0); }, expanded(in("x", {R, C}), {1, C})},
      {"sum_axis2_4d", [](Tensor x) { return sum(x, 2); }, in("x", {2, 3, R, z(3, 64)})},
  };
  for (const Red& r : reds) {
    auto f = r.f;
    cs.push_back(make_case(
        r.name, {Op::SUM}, {r.x}, [f](Context&, X x) { return f(x[0]); }, true));
  }
  Case m0 = make_case(
      "mean_all", {Op::SUM}, {in("x", {R, C})}, [](Context&, X x) { return mean(x[0]); }, true);
  m0.spec = mean_spec(-1, false);
  cs.push_back(m0);
  Case m1 = make_case(
      "mean_axis1_keepdim", {Op::SUM}, {in("x", {2, R, C})},
      [](Context&, X x) { return mean(x[0], 1, true); }, true);
  m1.spec = mean_spec(1, true);
  cs.push_back(m1);
  Case m2 = make_case(
      "mean_axis_neg1", {Op::SUM}, {with(in("x", {R, C}), Layout::transposed)},
      [](Context&, X x) { return mean(x[0], -1); }, true);
  m2.spec = mean_spec(1, false);
  cs.push_back(m2);
  // sum_to: sums broadcast dims away (what backward rules use).
  Case st = make_case(
      "sum_to", {Op::SUM}, {in("x", {2, R, C})},
      [R](Context&, X x) {
        return sum_to(x[0], {R, 1});
      },
      true);
  st.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int64_t R = x.shape[1], C = x.shape[2];
    RefValue w = ref_value({R, 1}, std::vector<double>(size_t(R), 0.0));
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t r = 0; r < R; ++r)
        for (int64_t c = 0; c < C; ++c) w.v[size_t(r)] += x.v[size_t((b * R + r) * C + c)];
    return spec_compare(w, out);
  };
  cs.push_back(st);
}

void add_max(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(4, 512), C = z(37, 1024);
  const Gen g = gen::distinct(-3, 3);  // no ties: the max is unique and FD-stable
  struct Red {
    const char* name;
    std::function<Tensor(Tensor)> f;
    Input x;
  };
  const Red reds[] = {
      {"max_all", [](Tensor x) { return max(x); }, in("x", {R, C}, g)},
      {"max_axis0", [](Tensor x) { return max(x, 0); }, in("x", {R, C}, g)},
      {"max_axis1_keepdim", [](Tensor x) { return max(x, 1, true); }, in("x", {R, C}, g)},
      {"max_axis1_3d", [](Tensor x) { return max(x, 1); }, in("x", {2, R, C}, g)},
      {"max_axis_neg1_transposed", [](Tensor x) { return max(x, -1); },
       with(in("x", {R, C}, g), Layout::transposed)},
      {"max_all_narrowed", [](Tensor x) { return max(x); },
       with(in("x", {R, C}, g), Layout::narrowed)},
  };
  for (const Red& r : reds) {
    auto f = r.f;
    cs.push_back(make_case(
        r.name, {Op::MAX}, {r.x}, [f](Context&, X x) { return f(x[0]); }, true));
  }
  // All-negative values (a max kernel that starts from 0 would be wrong).
  cs.push_back(make_case(
      "max_axis1_negative", {Op::MAX}, {in("x", {R, C}, gen::distinct(-9, -1))},
      [](Context&, X x) { return max(x[0], 1); }, true));
}

// topk_indices: distinct values, ties (lower index first), a strided source,
// k = C (a full sort) and rows of a 3-D tensor.
void add_topk(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(5, 4096), C = z(8, 128);
  auto tk = [](int64_t k) { return [k](Context&, X x) { return topk_indices(x[0], k); }; };
  cs.push_back(
      make_case("topk", {Op::TOPK}, {in("x", {R, C}, gen::distinct(-3, 3))}, tk(2), false));
  cs.push_back(
      make_case("topk_ties", {Op::TOPK}, {in("x", {R, C}, gen::choice({-1, 0, 2}))}, tk(3), false));
  cs.push_back(make_case("topk_transposed_3d", {Op::TOPK},
                         {with(in("x", {2, R, C}, gen::distinct(-3, 3)), Layout::transposed)},
                         tk(4), false));
  cs.push_back(make_case("topk_full_sort", {Op::TOPK}, {in("x", {R, C}, gen::distinct(-3, 3))},
                         tk(C), false));
}

void add_argmax_count(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(5, 512), C = z(37, 1024);
  const Gen ties = gen::choice({-1, 0, 2, 2.5});  // frequent ties: the first max wins
  auto exact = [](Case c) {
    c.tol = {0, 0};
    return c;
  };
  cs.push_back(exact(make_case(
      "argmax_axis1_ties", {Op::ARGMAX}, {in("x", {R, C}, ties)},
      [](Context&, X x) { return argmax(x[0], 1); }, false)));
  cs.push_back(exact(make_case(
      "argmax_axis0_keepdim", {Op::ARGMAX}, {in("x", {R, C}, ties)},
      [](Context&, X x) { return argmax(x[0], 0, true); }, false)));
  cs.push_back(exact(make_case(
      "argmax_3d_transposed", {Op::ARGMAX}, {with(in("x", {2, R, C}, ties), Layout::transposed)},
      [](Context&, X x) { return argmax(x[0], 2); }, false)));
  cs.push_back(exact(make_case(
      "argmax_negative_axis", {Op::ARGMAX}, {in("x", {R, C}, gen::distinct(-5, -1))},
      [](Context&, X x) { return argmax(x[0], -1); }, false)));
  const Gen few = gen::choice({0, 1, 2});
  Case ce = exact(make_case(
      "count_equal_f32", {Op::COUNT_EQUAL}, {in("a", {R, C}, few), in("b", {R, C}, few)},
      [](Context&, X x) { return count_equal(x[0], x[1]); }, false));
  ce.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    double n = 0;
    for (size_t k = 0; k < in[0].v.size(); ++k) n += in[0].v[k] == in[1].v[k];
    if (out.dtype != DType::i32) return std::string("count_equal is not i32");
    return spec_compare(ref_value(Shape(), {n}), out);
  };
  cs.push_back(ce);
  cs.push_back(exact(make_case(
      "count_equal_i32_strided", {Op::COUNT_EQUAL},
      {in_i32("a", {R, C}, gen::integers(0, 2)),
       with(in_i32("b", {R, C}, gen::integers(0, 2)), Layout::transposed)},
      [](Context&, X x) { return count_equal(x[0], x[1]); }, false)));
  // Accuracy the way training computes it: argmax of logits vs labels.
  cs.push_back(exact(make_case(
      "count_equal_argmax", {Op::COUNT_EQUAL, Op::ARGMAX},
      {in("logits", {R, C}, gen::distinct(-2, 2)), in_i32("labels", {R}, gen::integers(0, C - 1))},
      [](Context&, X x) { return count_equal(argmax(x[0], 1), x[1]); }, false)));
}

}  // namespace

void add_reduce_cases(std::vector<Case>& cs, Sz z) {
  add_sum(cs, z);
  add_max(cs, z);
  add_argmax_count(cs, z);
  add_topk(cs, z);
}

}  // namespace kiln::test
