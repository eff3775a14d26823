// SUM over a bf16 tensor (f32 result): a node only Graph::sum_bf16_gradients
// makes (the builder takes f32), so built here with detail::new_op. Every
// layout path of the CPU kernel against the f32 SUM of the widened values:
// bit-identical where the paths share their order (dense and strided
// columns), within f32 rounding elsewhere (dense rows, full reductions), for
// 1 and 3 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/random_values.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

struct Sums {
  std::vector<float> bf16_in, f32_in;
};

// sum(x, axis) (axis -1: all) of x [shape] or of its transpose, read as bf16
// and as the f32 widening of the same values.
Sums sum_both(const Shape& shape, int axis, bool transposed, int threads) {
  Context ctx;
  Tensor x16 = ctx.input(bf16, shape, "x16"), x32 = ctx.input(f32, shape, "x32");
  Tensor a16 = transposed ? x16.T() : x16, a32 = transposed ? x32.T() : x32;
  Tensor want = axis < 0 ? sum(a32) : sum(a32, axis, false);
  Tensor got(detail::new_op(Op::SUM, f32, want.shape(), {a16.node()}, ReduceParams{axis, false}));
  Graph g = Graph::forward({want, got});
  CpuBackend cpu(threads);
  auto buf = allocate_tensors(ctx, cpu);
  const kiln_test::Bf16Values v = kiln_test::bf16_values(size_t(shape.numel()), 3, 10.0f);
  x16.set(v.bits);
  x32.set(v.widened);
  cpu.compute(g);
  return {got.get<float>(), want.get<float>()};
}

TEST(SumBf16, MatchesTheF32SumOfTheWidenedValues) {
  struct Case {
    Shape shape;
    int axis;
    bool transposed, exact;
  };
  const Case cases[] = {
      {{300, 40}, 0, false, true},    // dense columns (a bias gradient)
      {{4, 70, 9}, 1, false, true},   // columns with a row step
      {{300, 40}, 1, true, true},     // strided (a transposed view)
      {{40, 300}, 1, false, false},   // dense rows
      {{300, 40}, -1, false, false},  // everything
      {{300, 40}, -1, true, false},   // everything, strided
  };
  for (const Case& c : cases)
    for (int threads : {1, 3}) {
      const Sums s = sum_both(c.shape, c.axis, c.transposed, threads);
      ASSERT_EQ(s.bf16_in.size(), s.f32_in.size());
      for (size_t i = 0; i < s.f32_in.size(); ++i) {
        if (c.exact) EXPECT_EQ(s.bf16_in[i], s.f32_in[i]) << c.shape.str() << " axis " << c.axis;
        else
          EXPECT_NEAR(s.bf16_in[i], s.f32_in[i], 1e-5 * (1 + std::fabs(s.f32_in[i])))
              << c.shape.str() << " axis " << c.axis;
      }
    }
}

}  // namespace
}  // namespace kiln::test
