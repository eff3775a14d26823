// Graph::bf16_gelu_inputs: under the bf16 policy a Linear whose output only
// GELU and GELU's backward read stores it in bf16 (as PyTorch's autocast
// does), through a cast that fuse_bf16_casts folds into the product. The
// result is bit-identical to writing gelu(h.to(bf16)) by hand; the f32 output
// is never computed, and the planned buffer shrinks.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/gelu_mlp.h"
#include "common/graph_checks.h"
#include "common/two_block_training.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::nodes_of;
using kiln_test::same_bits;

using GeluInputMlp = kiln_test::GeluMlp;

// With the CPU rewrites an OptContext makes, GELU reads the Linear's output a
// as built (kOff), through a.to(bf16) written by hand (kHand), or as built
// with this pass run (kPass).
enum Build { kOff, kHand, kPass };
struct Built {
  size_t cast = 0;
  GeluInputMlp m;
  Built(Build b, GeluApprox approx, DType precision = bf16)
      : m(
            precision, approx, [b](Tensor a) { return b == kHand ? a.to(bf16) : a; },
            [&](Graph& g) {
              g.fuse_matmul_bias();
              g.sum_bf16_gradients();
              if (b == kPass) cast = g.bf16_gelu_inputs();
              g.fuse_bf16_casts();
            }) {}
  // GELU nodes (forward, backward) reading a bf16 input.
  std::pair<int, int> bf16_gelu_reads(GeluApprox approx) const {
    const Op fwd = approx == GeluApprox::none ? Op::GELU_ERF : Op::GELU;
    const Op back = approx == GeluApprox::none ? Op::GELU_ERF_BACK : Op::GELU_BACK;
    std::pair<int, int> r{0, 0};
    for (const TensorNode* n : m.graph.nodes()) {
      r.first += n->op == fwd && n->src[0]->dtype == bf16;
      r.second += n->op == back && n->src[1]->dtype == bf16;
    }
    return r;
  }
  size_t planned_bytes() {
    CpuBackend cpu(1);
    return GraphAllocator(cpu.buffer_type()).measure(m.graph).buffer_size;
  }
};

TEST(Bf16GeluInputs, TheLinearStoresBf16AsTheCastByHandWould) {
  for (const GeluApprox approx : {GeluApprox::none, GeluApprox::tanh}) {
    Built off(kOff, approx), hand(kHand, approx), pass(kPass, approx);
    EXPECT_EQ(pass.cast, 1u);
    // c_fc's product stores bf16; GELU (its output's cast fused in) reads it,
    // and so does GELU's backward, as x.
    EXPECT_EQ(nodes_of(off.m.graph, Op::MATMUL, bf16), 0);
    EXPECT_EQ(nodes_of(pass.m.graph, Op::MATMUL, bf16), 1);
    EXPECT_EQ(off.bf16_gelu_reads(approx), std::make_pair(0, 0));
    EXPECT_EQ(pass.bf16_gelu_reads(approx), std::make_pair(1, 1));
    EXPECT_EQ(hand.bf16_gelu_reads(approx), std::make_pair(1, 1));
    // The f32 output [M, H] is gone, a bf16 one (half the bytes) in its place.
    EXPECT_LT(pass.planned_bytes(), off.planned_bytes());
    for (Built* b : {&off, &hand, &pass}) b->m.run();
    EXPECT_TRUE(same_bits(hand.m.loss.get<float>(), pass.m.loss.get<float>()));
    for (auto p : {&GeluInputMlp::x, &GeluInputMlp::w1, &GeluInputMlp::b1, &GeluInputMlp::w2,
                   &GeluInputMlp::b2})
      EXPECT_TRUE(same_bits(hand.m.grad(p), pass.m.grad(p))) << (hand.m.*p).label();
    // Against GELU on the f32 output: within the input's bf16 rounding.
    const float l0 = off.m.loss.get<float>()[0], l1 = pass.m.loss.get<float>()[0];
    EXPECT_NEAR(l1, l0, 1e-2 * std::fabs(l0));
    EXPECT_NE(l1, l0);
    for (auto p : {&GeluInputMlp::w1, &GeluInputMlp::w2}) {
      const std::vector<float> g0 = off.m.grad(p), g1 = pass.m.grad(p);
      double diff = 0, mag = 0;
      for (size_t i = 0; i < g0.size(); ++i) {
        diff += std::fabs(double(g1[i]) - g0[i]);
        mag += std::fabs(double(g0[i]));
      }
      EXPECT_LT(diff, 1e-2 * mag) << (off.m.*p).label();
    }
  }
}

TEST(Bf16GeluInputs, F32ProductsAndSharedOutputsAreLeftAlone) {
  {
    Built f32_policy(kPass, GeluApprox::none, f32);  // f32 factors: no cast to make
    EXPECT_EQ(f32_policy.cast, 0u);
    EXPECT_EQ(nodes_of(f32_policy.m.graph, Op::MATMUL, bf16), 0);
  }
  // The Linear's output also feeds a residual add: it must stay f32.
  Context ctx;
  ctx.set_matmul_precision(bf16);
  Tensor x = ctx.param(f32, {8, 6}, "x"), w = ctx.param(f32, {6, 6}, "w");
  Tensor a = matmul(x, w.T());
  Tensor loss = sum(matmul(gelu(a), w) + a);
  EXPECT_TRUE(kiln_test::pass_leaves_alone(loss, &Graph::bf16_gelu_inputs));
}

// In an OptContext: two transformer blocks train close to the pass off
// (without GraphPass::bf16_gelu_inputs), and each block's c_fc product stores bf16.
TEST(Bf16GeluInputs, OptContextTrainsTwoBlocks) {
  kiln_test::TwoBlockRun run[2];
  int bf16_products[2] = {0, 0}, gelu_bf16_x[2] = {0, 0};
  for (int pass = 0; pass < 2; ++pass)
    run[pass] = kiln_test::train_two_blocks(
        bf16, 2,
        pass ? std::nullopt
             : std::optional(kiln_test::training_passes_without({GraphPass::bf16_gelu_inputs})),
        [&](const Graph& g) {
          for (const TensorNode* n : g.nodes()) {
            bf16_products[pass] += n->op == Op::MATMUL && n->dtype == bf16;
            gelu_bf16_x[pass] +=
                (n->op == Op::GELU_ERF || n->op == Op::GELU) && n->src[0]->dtype == bf16;
          }
        });
  EXPECT_EQ(gelu_bf16_x[0], 0);
  EXPECT_EQ(gelu_bf16_x[1], 2);                       // one per block
  EXPECT_EQ(bf16_products[1] - bf16_products[0], 2);  // c_fc's, one per block
  for (size_t s = 0; s < run[0].losses.size(); ++s)
    EXPECT_NEAR(run[0].losses[s], run[1].losses[s], 1e-2 * std::fabs(run[0].losses[s])) << s;
  EXPECT_NE(run[0].losses[0], run[1].losses[0]);  // GELU read rounded inputs
}

}  // namespace
}  // namespace kiln::test
