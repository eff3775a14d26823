// Cases: views (reshape, permute, narrow, expand).
#include <cmath>

#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

void add_view_only_cases(std::vector<Case>& cs, Sz z) {
  const int64_t a = z(6, 512), b = z(4, 512);
  cs.push_back(make_case(
      "reshape", {Op::RESHAPE}, {in("x", {a, b})},
      [a, b](Context&, X x) {
        return x[0].reshape({2, a * b / 2}) * 1.5f;
      },
      true));
  cs.push_back(make_case(
      "reshape_infer_dim", {Op::RESHAPE}, {in("x", {a, b})},
      [](Context&, X x) {
        return x[0].reshape({-1, 2, 4});
      },
      true));
  cs.push_back(make_case(
      "view_3d", {Op::RESHAPE}, {in("x", {a, b})},
      [a, b](Context&, X x) {
        return x[0].view({2, a / 2, b});
      },
      true));
  // A reshape of a non-contiguous view must copy first (COPY then RESHAPE).
  cs.push_back(make_case(
      "reshape_of_transposed", {Op::RESHAPE, Op::COPY, Op::PERMUTE},
      {with(in("x", {a, b}), Layout::transposed)},
      [a, b](Context&, X x) { return x[0].reshape({a * b}); }, true));
  cs.push_back(make_case(
      "permute_3d", {Op::PERMUTE}, {in("x", {2, z(3, 64), z(4, 256)})},
      [](Context&, X x) {
        return x[0].permute({2, 0, 1});
      },
      true));
  cs.push_back(make_case(
      "permute_4d", {Op::PERMUTE}, {in("x", {2, 3, z(2, 32), z(4, 256)})},
      [](Context&, X x) {
        return x[0].permute({1, 3, 0, 2}) * 2.0f;
      },
      true));
  cs.push_back(make_case(
      "transpose_outer", {Op::PERMUTE}, {in("x", {2, z(3, 64), z(4, 256)})},
      [](Context&, X x) { return x[0].transpose(0, 2); }, true));
  cs.push_back(make_case(
      "narrow_2d", {Op::NARROW}, {in("x", {z(5, 512), z(6, 512)})},
      [](Context&, X x) { return x[0].narrow(0, 1, 3).narrow(1, 2, 3); }, true));
  cs.push_back(make_case(
      "narrow_negative_dim", {Op::NARROW}, {in("x", {2, z(3, 64), z(7, 512)})},
      [](Context&, X x) { return x[0].narrow(-1, 4, 3) + 1.0f; }, true));
  cs.push_back(make_case(
      "narrow_of_permuted", {Op::NARROW, Op::PERMUTE},
      {with(in("x", {z(4, 128), 3, z(5, 256)}), Layout::permuted)},
      [](Context&, X x) { return x[0].narrow(1, 1, 2); }, true));
  cs.push_back(make_case(
      "expand_leading", {Op::EXPAND}, {in("x", {z(3, 512), 1})},
      [z](Context&, X x) {
        return x[0].expand({2, x[0].size(0), z(4, 512)});
      },
      true));
  cs.push_back(make_case(
      "expand_then_transpose", {Op::EXPAND, Op::PERMUTE}, {in("x", {1, z(4, 512)})},
      [z](Context&, X x) {
        return x[0].expand({z(3, 512), x[0].size(1)}).T() * 0.5f;
      },
      true));
}

}  // namespace

void add_views_cases(std::vector<Case>& cs, Sz z) { add_view_only_cases(cs, z); }

}  // namespace kiln::test
