// Graph::sum_bf16_gradients: under the bf16 policy a Linear's bias gradient
// sums the bf16 copy of its output gradient (as PyTorch's autocast does), so
// that gradient's producer (GELU's backward) stores bf16 and its f32 values are
// never written. The products' gradients stay bit-identical; the bias gradient
// is the sum of the rounded terms.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "common/gelu_mlp.h"
#include "common/graph_checks.h"
#include "common/two_block_training.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::nodes_of;
using kiln_test::same_bits;

using GradSumMlp = kiln_test::GeluMlp;

// The rewrites an OptContext makes: the bias fusion, then optionally this
// pass, then the cast fusion.
struct GradSumBuilt {
  size_t repointed = 0;
  GradSumMlp m;
  explicit GradSumBuilt(bool pass)
      : m(
            bf16, GeluApprox::none, [](Tensor a) { return a; },
            [&](Graph& g) {
              g.fuse_matmul_bias();
              if (pass) repointed = g.sum_bf16_gradients();
              g.fuse_bf16_casts();
            }) {}
};

TEST(Bf16GradSums, BiasSumsTheRoundedGradientAndGeluBackStoresBf16) {
  GradSumBuilt off_build(false), on_build(true);
  GradSumMlp &off = off_build.m, &on = on_build.m;
  EXPECT_EQ(on_build.repointed, 1u);  // b1's sum (b2's gradient is the loss's, never cast)
  // Without the pass the GELU gradient stays f32 (its sum reads it); with it,
  // GELU's backward stores bf16 and the sum reads that.
  EXPECT_EQ(nodes_of(off.graph, Op::GELU_ERF_BACK, f32), 1);
  EXPECT_EQ(nodes_of(on.graph, Op::GELU_ERF_BACK, bf16), 1);
  EXPECT_EQ(nodes_of(on.graph, Op::GELU_ERF_BACK, f32), 0);
  off.run();
  on.run();
  EXPECT_TRUE(same_bits(off.loss.get<float>(), on.loss.get<float>()));
  for (auto p : {&GradSumMlp::x, &GradSumMlp::w1, &GradSumMlp::w2, &GradSumMlp::b2})
    EXPECT_TRUE(same_bits(off.grad(p), on.grad(p))) << (off.*p).label();
  // b1's gradient: the column sums of the f32 gradient of `a` (off) rounded
  // to bf16 term by term, and within bf16 rounding of the f32 sums.
  const std::vector<float> ga = off.grad(&GradSumMlp::a);
  const std::vector<float> want32 = off.grad(&GradSumMlp::b1);
  const std::vector<float> got = on.grad(&GradSumMlp::b1);
  ASSERT_EQ(ga.size(), size_t(GradSumMlp::M * GradSumMlp::H));
  for (int64_t j = 0; j < GradSumMlp::H; ++j) {
    double rounded = 0, mag = 0;
    for (int64_t i = 0; i < GradSumMlp::M; ++i) {
      const float g = ga[size_t(i * GradSumMlp::H + j)];
      rounded += double(bf16_to_f32(f32_to_bf16(g)));
      mag += std::fabs(double(g));
    }
    EXPECT_NEAR(got[size_t(j)], rounded, 1e-5 * mag) << j;
    EXPECT_NEAR(got[size_t(j)], want32[size_t(j)], 4e-3 * mag) << j;  // bf16: 2^-9 per term
    EXPECT_NE(got[size_t(j)], want32[size_t(j)]) << j;                // the terms were rounded
  }
}

TEST(Bf16GradSums, F32GraphsAndUncastGradientsAreLeftAlone) {
  Context ctx;  // the f32 policy makes no casts: nothing to re-point
  Tensor x = ctx.param(f32, {8, 6}, "x"), w = ctx.param(f32, {5, 6}, "w"),
         b = ctx.param(f32, {5}, "b");
  Tensor loss = sum(matmul(gelu(matmul(x, w.T()) + b), w));
  EXPECT_TRUE(kiln_test::pass_leaves_alone(loss, &Graph::sum_bf16_gradients));
}

// In an OptContext: two transformer blocks train as they do with the pass off
// (without GraphPass::bf16_grad_sums) but for the MLP biases' rounding, and GELU's
// backward stores bf16 in each block.
TEST(Bf16GradSums, OptContextTrainsTwoBlocks) {
  kiln_test::TwoBlockRun run[2];
  int bf16_gelu_back[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass)
    run[pass] = kiln_test::train_two_blocks(
        bf16, 2,
        pass ? std::nullopt
             : std::optional(kiln_test::training_passes_without({GraphPass::bf16_grad_sums})),
        [&](const Graph& g) {
          for (const TensorNode* n : g.nodes())
            bf16_gelu_back[pass] +=
                (n->op == Op::GELU_BACK || n->op == Op::GELU_ERF_BACK) && n->dtype == bf16;
        });
  EXPECT_EQ(bf16_gelu_back[0], 0);
  EXPECT_EQ(bf16_gelu_back[1], 2);                // one per block
  EXPECT_EQ(run[0].losses[0], run[1].losses[0]);  // the first forward pass is the same
  for (size_t s = 1; s < run[0].losses.size(); ++s)
    EXPECT_NEAR(run[0].losses[s], run[1].losses[s], 1e-3 * std::fabs(run[0].losses[s])) << s;
  EXPECT_NE(run[0].params, run[1].params);  // the rounding shows in the biases
}

}  // namespace
}  // namespace kiln::test
