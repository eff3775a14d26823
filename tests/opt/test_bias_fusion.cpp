// Graph::fuse_matmul_bias: a bias add after a 2-D product folds into the
// MATMUL (the CPU GEMM adds it as it stores C); values and gradients stay
// bit-identical, f32 and under the bf16 policy, on 1 and 2 threads, and the
// bf16 cast fusion still applies after it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/graph_checks.h"
#include "common/random_values.h"
#include "common/two_block_training.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::same_bits;
using kiln_test::uniform_floats;

int biased_products(const Graph& g) {
  int n = 0;
  for (const TensorNode* t : g.nodes()) n += t->op == Op::MATMUL && t->n_src == 3;
  return n;
}
// ADDs of a product's result: the adds left unfused.
int adds_of_products(const Graph& g) {
  int n = 0;
  for (const TensorNode* t : g.nodes())
    n += t->op == Op::ADD && (t->src[0]->op == Op::MATMUL || t->src[1]->op == Op::MATMUL);
  return n;
}

// y = b2 + gelu(x W1^T + b1) W2^T, loss sum(y * t): the first bias [H] added
// after the product, the second [1, O] before it. M = 1 takes the kernel's
// matrix-vector path.
struct BiasMlp {
  static constexpr int64_t D = 70, H = 45, O = 19;
  int64_t M;
  Context ctx;
  Tensor x, w1, b1, w2, b2, t, y, loss;
  Graph graph;
  std::unique_ptr<Buffer> buf;
  size_t fused = 0, casts = 0;

  BiasMlp(DType precision, bool fuse, int64_t rows) : M(rows) {
    ctx.set_matmul_precision(precision);
    x = ctx.param(f32, {M, D}, "x");
    w1 = ctx.param(f32, {H, D}, "w1");
    b1 = ctx.param(f32, {H}, "b1");
    w2 = ctx.param(f32, {O, H}, "w2");
    b2 = ctx.param(f32, {1, O}, "b2");
    t = ctx.input(f32, {M, O}, "t");
    Tensor h = gelu(matmul(x, w1.T()) + b1);
    y = b2 + matmul(h, w2.T());
    loss = sum(y * t);
    graph = Graph::forward(loss);
    graph.expand(y);
    graph.backward(loss);
    if (fuse) {
      fused = graph.fuse_matmul_bias();
      casts = graph.fuse_bf16_casts();
    }
  }
  void run(int threads) {
    buf = kiln_test::run_filled(ctx, graph, {x, w1, b1, w2, b2, t}, threads);
  }
};

TEST(BiasFusion, MlpValuesAndGradientsAreBitIdentical) {
  for (DType precision : {f32, bf16})
    for (int64_t rows : {int64_t(1), int64_t(33)})
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(precision)) + " M=" + std::to_string(rows) +
                     " threads=" + std::to_string(threads));
        BiasMlp plain(precision, false, rows), fused(precision, true, rows);
        EXPECT_EQ(adds_of_products(plain.graph), 2);
        EXPECT_EQ(fused.fused, 2u);
        EXPECT_EQ(adds_of_products(fused.graph), 0);
        EXPECT_EQ(biased_products(fused.graph), 2);
        // The two products left the graph; under bf16 the GELU's cast still
        // fuses into it (its gradient's cast stays: b1's gradient reads the
        // f32 gradient too).
        EXPECT_EQ(fused.graph.size() + 2 + fused.casts, plain.graph.size());
        EXPECT_EQ(fused.casts, precision == bf16 ? 1u : 0u);
        plain.run(threads);
        fused.run(threads);
        EXPECT_TRUE(same_bits(plain.y.get<float>(), fused.y.get<float>()));
        EXPECT_TRUE(same_bits(plain.loss.get<float>(), fused.loss.get<float>()));
        for (auto p : {&BiasMlp::x, &BiasMlp::w1, &BiasMlp::b1, &BiasMlp::w2, &BiasMlp::b2})
          EXPECT_TRUE(same_bits(plain.graph.grad(plain.*p).get<float>(),
                                fused.graph.grad(fused.*p).get<float>()))
              << (plain.*p).label();
      }
}

TEST(BiasFusion, LeavesOtherAddsAlone) {
  Context ctx;
  Tensor x = ctx.input(f32, {6, 8}, "x"), w = ctx.param(f32, {5, 8}, "w");
  Tensor b = ctx.param(f32, {5}, "b"), full_b = ctx.param(f32, {6, 5}, "full_b");
  Tensor x3 = ctx.input(f32, {2, 6, 8}, "x3");

  Tensor p1 = matmul(x, w.T());  // read twice: computed anyway
  Graph g1 = Graph::forward(sum(p1 + b) + sum(p1));
  EXPECT_EQ(g1.fuse_matmul_bias(), 0u);

  Tensor p2 = matmul(x, w.T());  // an output: its values are wanted
  Graph g2 = Graph::forward({p2 + b, p2});
  EXPECT_EQ(g2.fuse_matmul_bias(), 0u);

  Graph g3 = Graph::forward(matmul(x, w.T()) + full_b);  // not a bias row
  EXPECT_EQ(g3.fuse_matmul_bias(), 0u);

  Graph g4 = Graph::forward(matmul(x3, w.T()) + b);  // batched product
  EXPECT_EQ(g4.fuse_matmul_bias(), 0u);

  Graph g5 = Graph::forward(matmul(x, w.T()) + b);
  const size_t before = g5.size();
  EXPECT_EQ(g5.fuse_matmul_bias(), 1u);
  EXPECT_EQ(g5.size() + 1, before);
  EXPECT_EQ(biased_products(g5), 1);
}

// The fused nodes are the context's: a graph built after the fusion (another
// OptContext on the same outputs) differentiates through them, the bias
// getting the gradient the ADD's rule gave it.
TEST(BiasFusion, BackwardThroughAFusedProduct) {
  std::vector<float> grads[2][3];
  for (int fuse = 0; fuse < 2; ++fuse) {
    Context ctx;
    Tensor x = ctx.param(f32, {9, 20}, "x"), w = ctx.param(f32, {7, 20}, "w");
    Tensor b = ctx.param(f32, {7}, "b");
    Tensor y = matmul(x, w.T()) + b;
    Graph first = Graph::forward(y);
    if (fuse) EXPECT_EQ(first.fuse_matmul_bias(), 1u);
    Tensor loss = sum(y * y);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    CpuBackend cpu(2);
    auto buf = allocate_tensors(ctx, cpu);
    x.set(uniform_floats(size_t(x.numel()), 1));
    w.set(uniform_floats(size_t(w.numel()), 2));
    b.set(uniform_floats(size_t(b.numel()), 3));
    g.reset_grads();
    cpu.compute(g);
    int i = 0;
    for (Tensor p : {x, w, b}) grads[fuse][i++] = g.grad(p).get<float>();
    EXPECT_EQ(biased_products(g), fuse);
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(same_bits(grads[0][i], grads[1][i])) << i;
}

// Two pre-LN transformer blocks (every Linear with a bias) trained by an
// OptContext on the CPU: the same losses and parameters, bit for bit, with the
// fusion and without (GraphPass::fuse_bias). (GELU's bf16 input needs the
// fused bias, and changes values: off in both runs.)
TEST(BiasFusion, OptContextTrainsTransformerBlocksIdentically) {
  using kiln_test::training_passes_without;
  for (DType precision : {f32, bf16})
    for (int threads : {1, 2}) {
      SCOPED_TRACE(std::string(dtype_name(precision)) + " threads=" + std::to_string(threads));
      kiln_test::TwoBlockRun run[2];
      int biased[2] = {0, 0};
      for (int fuse = 0; fuse < 2; ++fuse)
        run[fuse] = kiln_test::train_two_blocks(
            precision, threads,
            fuse ? training_passes_without({GraphPass::bf16_gelu_inputs})
                 : training_passes_without({GraphPass::bf16_gelu_inputs, GraphPass::fuse_bias}),
            [&](const Graph& g) { biased[fuse] = biased_products(g); });
      EXPECT_EQ(biased[0], 0);
      EXPECT_EQ(biased[1], 8);  // c_attn, c_proj, c_fc and the MLP's c_proj, per block
      EXPECT_EQ(run[0].losses, run[1].losses);        // exact
      EXPECT_NE(run[1].losses[0], run[1].losses[2]);  // it trained
      ASSERT_EQ(run[0].params.size(), run[1].params.size());
      for (size_t i = 0; i < run[0].params.size(); ++i)
        EXPECT_TRUE(same_bits(run[0].params[i], run[1].params[i])) << "param " << i;
    }
}

}  // namespace
}  // namespace kiln::test
