// Cases: elementwise binary ops with numpy broadcasting in both directions and
// with leading dims, strided and expanded operands; comparisons; where.
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;
using BinFn = Tensor (*)(Tensor, Tensor);

struct Variant {
  std::string suffix;
  Input a, b;
};

// Every broadcasting direction, leading-dim broadcasting, and non-contiguous
// operands. `gb` makes b's values (divisors need |b| away from 0).
std::vector<Variant> variants(Sz z, const Gen& ga, const Gen& gb) {
  const int64_t R = z(3, 256), C = z(37, 512);
  auto A = [&](Shape s) { return in("a", s, ga); };
  auto B = [&](Shape s) { return in("b", s, gb); };
  return {
      {"same", A({R, C}), B({R, C})},
      {"bcast_row", A({R, C}), B({C})},
      {"bcast_row_rev", A({C}), B({R, C})},
      {"bcast_col", A({R, C}), B({R, 1})},
      {"bcast_col_rev", A({R, 1}), B({R, C})},
      {"bcast_outer", A({R, 1}), B({1, C})},
      {"bcast_lead", A({2, R, C}), B({R, C})},
      {"bcast_lead_rev", A({R, C}), B({2, R, C})},
      {"bcast_4d", A({2, 1, R, 1}), B({3, 1, C})},
      {"bcast_scalar", A({R, C}), B({1})},
      {"bcast_scalar_rev", A({1}), B({R, C})},
      {"bcast_0d", A({R, C}), B(Shape())},  // a 0-dim tensor (PyTorch scalar tensor)
      {"strided", with(A({R, C}), Layout::transposed), with(B({R, C}), Layout::narrowed)},
      {"expanded", expanded(A({R, C}), {R, 1}), with(B({R, C}), Layout::permuted)},
      {"strided_bcast", with(A({2, R, C}), Layout::permuted), with(B({R, C}), Layout::transposed)},
  };
}

void add_arith(std::vector<Case>& cs, Sz z) {
  struct Bin {
    const char* name;
    Op op;
    BinFn f;
    Gen gb;
  };
  const Bin bins[] = {
      {"add", Op::ADD, [](Tensor a, Tensor b) { return kiln::add(a, b); }, gen::uniform(-1, 1)},
      {"sub", Op::SUB, [](Tensor a, Tensor b) { return kiln::sub(a, b); }, gen::uniform(-1, 1)},
      {"mul", Op::MUL, [](Tensor a, Tensor b) { return kiln::mul(a, b); }, gen::uniform(-1.5, 1.5)},
      {"div", Op::DIV, [](Tensor a, Tensor b) { return kiln::div(a, b); }, gen::magnitude(0.5, 2)},
  };
  for (const Bin& bn : bins) {
    for (Variant& v : variants(z, gen::uniform(-2, 2), bn.gb)) {
      BinFn f = bn.f;
      cs.push_back(make_case(
          std::string(bn.name) + "_" + v.suffix, {bn.op}, {v.a, v.b},
          [f](Context&, X x) { return f(x[0], x[1]); }, true));
    }
  }
  // The operators, including the tensor-scalar forms, against the API promise.
  const int64_t R = z(3, 256), C = z(37, 512);
  Case ops = make_case(
      "operators", {Op::ADD, Op::SUB, Op::MUL, Op::DIV, Op::NEG},
      {in("a", {R, C}), in("b", {R, C}, gen::magnitude(0.5, 2))},
      [](Context&, X x) { return (x[0] + x[1]) * x[0] - x[0] / x[1] + (-x[1]); }, true);
  ops.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    for (size_t k = 0; k < w.v.size(); ++k) {
      const double a = in[0].v[k], b = in[1].v[k];
      w.v[k] = (a + b) * a - a / b - b;
    }
    return spec_compare(w, out);
  };
  cs.push_back(ops);
  Case sc = make_case(
      "scalar_operators", {}, {in("a", {R, C})},
      [](Context&, X x) {
        Tensor a = x[0];
        return (a + 1.5f) * (2.0f - a) + (a * 3.0f) / 4.0f - (0.5f + a) * 2.0f + (a - 1.0f) +
               2.0f * a;
      },
      true);
  sc.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    for (double& a : w.v) a = (a + 1.5) * (2 - a) + (a * 3) / 4 - (0.5 + a) * 2 + (a - 1) + 2 * a;
    return spec_compare(w, out);
  };
  cs.push_back(sc);
}

void add_compare(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 512);
  struct Cmp {
    const char* name;
    BinFn f;
    bool (*want)(double, double);
  };
  const Cmp cmps[] = {
      {"eq", [](Tensor a, Tensor b) { return kiln::eq(a, b); },
       [](double a, double b) { return a == b; }},
      {"ne", [](Tensor a, Tensor b) { return kiln::ne(a, b); },
       [](double a, double b) { return a != b; }},
      {"lt", [](Tensor a, Tensor b) { return kiln::lt(a, b); },
       [](double a, double b) { return a < b; }},
      {"le", [](Tensor a, Tensor b) { return kiln::le(a, b); },
       [](double a, double b) { return a <= b; }},
      {"gt", [](Tensor a, Tensor b) { return kiln::gt(a, b); },
       [](double a, double b) { return a > b; }},
      {"ge", [](Tensor a, Tensor b) { return kiln::ge(a, b); },
       [](double a, double b) { return a >= b; }},
  };
  // Values from a small set so that ties (eq / le / ge edge cases) are common.
  const Gen g = gen::choice({-1, 0, 0.5, 1});
  for (const Cmp& cm : cmps) {
    BinFn f = cm.f;
    auto want = cm.want;
    Case c = make_case(
        std::string("cmp_") + cm.name, {Op::COMPARE}, {in("a", {R, C}, g), in("b", {R, C}, g)},
        [f](Context&, X x) { return f(x[0], x[1]); }, false);
    c.tol = {0, 0};
    c.spec = [want](const std::vector<RefValue>& in, const RefValue& out) {
      RefValue w = in[0];
      for (size_t k = 0; k < w.v.size(); ++k) w.v[k] = want(in[0].v[k], in[1].v[k]) ? 1 : 0;
      return spec_compare(w, out);
    };
    cs.push_back(c);
    Case b = make_case(
        std::string("cmp_") + cm.name + "_bcast_strided", {Op::COMPARE},
        {with(in("a", {2, R, C}, g), Layout::permuted), in("b", {C}, g)},
        [f](Context&, X x) { return f(x[0], x[1]); }, false);
    b.tol = {0, 0};
    cs.push_back(b);
  }
  const Gen gi = gen::integers(-2, 2);
  Case ci = make_case(
      "cmp_i32_bcast", {Op::COMPARE}, {in_i32("a", {R, C}, gi), in_i32("b", {R, 1}, gi)},
      [](Context&, X x) { return kiln::le(x[0], x[1]) + kiln::gt(x[0], x[1]) * 2.0f; }, false);
  ci.tol = {0, 0};
  cs.push_back(ci);
  Case cf = make_case(
      "cmp_scalar", {Op::COMPARE}, {in("a", {R, C}, gen::choice({-1, -0.25, 0.5, 1}))},
      [](Context&, X x) { return kiln::gt(x[0], 0.5f) + kiln::lt(x[0], -0.25f) * 2.0f; }, false);
  cf.tol = {0, 0};
  cf.spec = [](const std::vector<RefValue>& in, const RefValue& out) {
    RefValue w = in[0];
    for (double& a : w.v) a = (a > 0.5 ? 1 : 0) + (a < -0.25 ? 2 : 0);
    return spec_compare(w, out);
  };
  cs.push_back(cf);
}

void add_where(std::vector<Case>& cs, Sz z) {
  const int64_t R = z(3, 256), C = z(37, 512);
  cs.push_back(make_case(
      "where_f32_cond_bcast", {Op::WHERE},
      {constant(in("cond", {R, 1}, gen::choice({0, 1, -2}))), in("a", {R, C}), in("b", {C})},
      [](Context&, X x) { return where(x[0], x[1], x[2]); }, true));
  cs.push_back(make_case(
      "where_i32_cond_strided", {Op::WHERE},
      {in_i32("cond", {R, C}, gen::integers(0, 2)), with(in("a", {R, C}), Layout::transposed),
       in("b", {1})},
      [](Context&, X x) { return where(x[0], x[1], x[2]); }, true));
  cs.push_back(make_case(
      "where_lead_bcast", {Op::WHERE},
      {constant(in("cond", {2, 1, C}, gen::choice({0, 1}))), in("a", {R, 1}),
       with(in("b", {R, C}), Layout::narrowed)},
      [](Context&, X x) { return where(x[0], x[1], x[2]); }, true));
}

}  // namespace

void add_binary_cases(std::vector<Case>& cs, Sz z) {
  add_arith(cs, z);
  add_compare(cs, z);
  add_where(cs, z);
}

}  // namespace kiln::test
