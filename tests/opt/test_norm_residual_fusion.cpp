// Graph::fuse_norm_residual: the ADD summing a norm's input gradient with the
// tensor's other gradient folds into LAYER_NORM_BACK / RMS_NORM_BACK; values
// and gradients stay bit-identical, f32 and under the bf16 policy, on 1 and 2
// threads, and the other rewrites still apply after it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/graph_checks.h"
#include "common/random_values.h"
#include "common/two_block_training.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::same_bits;
using kiln_test::uniform_floats;

bool residual_of(const TensorNode* t) {
  if (t->op == Op::LAYER_NORM_BACK) return op_params<Op::LAYER_NORM_BACK>(*t).has_residual;
  if (t->op == Op::RMS_NORM_BACK) return op_params<Op::RMS_NORM_BACK>(*t).has_residual;
  return false;
}
int fused_norms(const Graph& g) {
  int n = 0;
  for (const TensorNode* t : g.nodes()) n += residual_of(t);
  return n;
}

// y = x + gelu(layer_norm(x) W1^T), z = y + rms_norm(y) * s, loss
// sum(layer_norm(z) * t): x and y each have a norm's gradient and the residual
// path's, summed by an ADD. y's residual gradient is the final norm's
// gradient, which the product with s reads too, so only the other way round
// fuses (as in a GPT's last block, whose c_proj reads ln_f's gradient).
struct Blocks {
  static constexpr int64_t B = 3, T = 7, D = 40;
  Context ctx;
  Tensor x, lw, lb, w1, rw, s, t, z, loss;
  Graph graph;
  std::unique_ptr<Buffer> buf;
  size_t fused = 0;

  Blocks(DType precision, bool fuse) {
    ctx.set_matmul_precision(precision);
    x = ctx.param(f32, {B, T, D}, "x");
    lw = ctx.param(f32, {D}, "lw");
    lb = ctx.param(f32, {D}, "lb");
    w1 = ctx.param(f32, {D, D}, "w1");
    rw = ctx.param(f32, {D}, "rw");
    s = ctx.param(f32, {B, T, D}, "s");
    t = ctx.input(f32, {B, T, D}, "t");
    Tensor y = x + gelu(matmul(layer_norm(x, lw, lb), w1.T()));
    z = y + rms_norm(y, rw) * s;
    loss = sum(layer_norm(z, Tensor(), Tensor()) * t);
    graph = Graph::forward(loss);
    graph.expand(z);
    graph.backward(loss);
    if (fuse) {
      graph.fuse_matmul_bias();
      fused = graph.fuse_norm_residual();
      graph.fuse_bf16_casts();
      graph.fold_bf16_casts();
    }
  }
  void run(int threads) {
    CpuBackend cpu(threads);
    buf = allocate_tensors(ctx, cpu);
    uint32_t seed = 1;
    for (Tensor p : {x, lw, lb, w1, rw, s, t}) p.set(uniform_floats(size_t(p.numel()), seed++));
    graph.reset_grads();
    cpu.compute(graph);
  }
};

TEST(NormResidualFusion, ValuesAndGradientsAreBitIdentical) {
  for (DType precision : {f32, bf16})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(precision)) + " threads=" + std::to_string(threads));
      Blocks plain(precision, false), fused(precision, true);
      EXPECT_EQ(fused_norms(plain.graph), 0);
      EXPECT_EQ(fused.fused, 2u);  // x's and y's gradient sums
      EXPECT_EQ(fused_norms(fused.graph), 2);
      plain.run(threads);
      fused.run(threads);
      EXPECT_TRUE(same_bits(plain.z.get<float>(), fused.z.get<float>()));
      for (auto p : {&Blocks::x, &Blocks::lw, &Blocks::lb, &Blocks::w1, &Blocks::rw, &Blocks::s})
        EXPECT_TRUE(same_bits(plain.graph.grad(plain.*p).get<float>(),
                              fused.graph.grad(fused.*p).get<float>()))
            << (plain.*p).label();
    }
}

TEST(NormResidualFusion, LeavesOtherAddsAlone) {
  Context ctx;
  Tensor dy = ctx.input(f32, {6, 8}, "dy"), x = ctx.input(f32, {6, 8}, "x");
  Tensor r = ctx.input(f32, {6, 8}, "r"), row = ctx.input(f32, {8}, "row");
  auto back = [&] {
    return detail::make_op(Op::LAYER_NORM_BACK, f32, x.shape(), {dy, x},
                           LayerNormParams{1e-5f, false, false, false});
  };
  Tensor s1 = back();  // read twice: computed anyway
  Graph g1 = Graph::forward(sum(s1 + r) + sum(s1));
  EXPECT_EQ(g1.fuse_norm_residual(), 0u);

  Tensor s2 = back();  // an output: its values are wanted
  Graph g2 = Graph::forward({s2 + r, s2});
  EXPECT_EQ(g2.fuse_norm_residual(), 0u);

  Graph g3 = Graph::forward(back() + row);  // broadcast: not the shape of dx
  EXPECT_EQ(g3.fuse_norm_residual(), 0u);

  Tensor s4 = back();
  Graph g4 = Graph::forward(s4 + s4);  // no other gradient to add
  EXPECT_EQ(g4.fuse_norm_residual(), 0u);

  Graph g5 = Graph::forward(r + back());
  const size_t before = g5.size();
  EXPECT_EQ(g5.fuse_norm_residual(), 1u);
  EXPECT_EQ(g5.size() + 1, before);
  EXPECT_EQ(fused_norms(g5), 1);
  EXPECT_EQ(g5.fuse_norm_residual(), 0u);  // one residual per kernel
}

// Two pre-LN transformer blocks trained by an OptContext on the CPU: the same
// losses and parameters, bit for bit, with the fusion and without
// (GraphPass::fuse_residual).
TEST(NormResidualFusion, OptContextTrainsTransformerBlocksIdentically) {
  for (DType precision : {f32, bf16})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(precision)) + " threads=" + std::to_string(threads));
      kiln_test::TwoBlockRun run[2];
      int fused[2] = {0, 0};
      for (int fuse = 0; fuse < 2; ++fuse)
        run[fuse] = kiln_test::train_two_blocks(
            precision, threads,
            fuse ? std::nullopt
                 : std::optional(kiln_test::training_passes_without({GraphPass::fuse_residual})),
            [&](const Graph& g) { fused[fuse] = fused_norms(g); });
      EXPECT_EQ(fused[0], 0);
      // ln_2 of both blocks and ln_1 of the second (the first block's input
      // is the graph's input, which has no gradient).
      EXPECT_EQ(fused[1], 3);
      EXPECT_EQ(run[0].losses, run[1].losses);        // exact
      EXPECT_NE(run[1].losses[0], run[1].losses[2]);  // it trained
      ASSERT_EQ(run[0].params.size(), run[1].params.size());
      for (size_t i = 0; i < run[0].params.size(); ++i)
        EXPECT_TRUE(same_bits(run[0].params[i], run[1].params[i])) << "param " << i;
    }
}

}  // namespace
}  // namespace kiln::test
