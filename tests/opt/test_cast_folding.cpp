// Graph::fold_bf16_casts: under the bf16 matmul policy the casts that only
// matmuls read (weights, an input, the output gradients of the products) are
// dropped and the matmuls read the f32 sources rounded as they pack them;
// values and gradients stay bit-identical (no subnormals in the data).
#include <gtest/gtest.h>

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

int bf16_casts(const Graph& g) {
  int n = 0;
  for (const TensorNode* t : g.nodes()) n += t->op == Op::COPY && t->dtype == bf16;
  return n;
}
int rounding_matmuls(const Graph& g) {
  int n = 0;
  for (const TensorNode* t : g.nodes())
    if (t->op == Op::MATMUL || t->op == Op::MATMUL_ACC)
      n += op_params<MatmulParams>(*t).round_bf16 != 0;
  return n;
}
// y = tanh(x @ w1^T + b1) @ w2^T (+ with `dying_source`, a third product of
// x * 2, whose cast's source nothing else reads), loss sum(y * t).
struct FoldNet {
  static constexpr int64_t M = 24, D = 40, H = 33, O = 17;
  Context ctx;
  Tensor x, w1, b1, w2, w3, t, y, loss;
  Graph graph;
  std::unique_ptr<Buffer> buf;
  size_t folded = 0;

  FoldNet(bool fold, bool dying_source = false) {
    ctx.set_matmul_precision(bf16);
    x = ctx.input(f32, {M, D}, "x");
    w1 = ctx.param(f32, {H, D}, "w1");
    b1 = ctx.param(f32, {H}, "b1");
    w2 = ctx.param(f32, {O, H}, "w2");
    w3 = ctx.param(f32, {O, D}, "w3");
    t = ctx.input(f32, {M, O}, "t");
    y = matmul(tanh(matmul(x, w1.T()) + b1), w2.T());
    if (dying_source) y = y + matmul(x * 2.0f, w3.T());
    loss = sum(y * t);
    graph = Graph::forward(loss);
    graph.expand(y);
    graph.backward(loss);
    graph.fuse_bf16_casts();
    if (fold) folded = graph.fold_bf16_casts();
  }
  void run(int threads) {
    CpuBackend cpu(threads);
    buf = allocate_tensors(ctx, cpu);
    x.set(uniform_floats(size_t(M * D), 1));
    w1.set(uniform_floats(size_t(H * D), 2));
    b1.set(uniform_floats(size_t(H), 3));
    w2.set(uniform_floats(size_t(O * H), 4));
    w3.set(uniform_floats(size_t(O * D), 5));
    t.set(uniform_floats(size_t(M * O), 6));
    graph.reset_grads();
    cpu.compute(graph);
  }
};

void expect_identical(FoldNet& a, FoldNet& b, bool with_w3) {
  EXPECT_TRUE(same_bits(a.y.get<float>(), b.y.get<float>()));
  EXPECT_TRUE(same_bits(a.loss.get<float>(), b.loss.get<float>()));
  for (auto p : {&FoldNet::w1, &FoldNet::b1, &FoldNet::w2, &FoldNet::w3}) {
    if (p == &FoldNet::w3 && !with_w3) continue;
    EXPECT_TRUE(same_bits(a.graph.grad(a.*p).get<float>(), b.graph.grad(b.*p).get<float>()))
        << (a.*p).label();
  }
}

TEST(CastFolding, CastsReadOnlyByMatmulsAreFoldedWithIdenticalResults) {
  for (int threads : {1, 2}) {
    FoldNet plain(false), folded(true);
    // x, w1, the tanh result (its backward reads it later) and w2 in the
    // forward; the two products' output gradients in the backward.
    EXPECT_EQ(bf16_casts(plain.graph), 6);
    EXPECT_EQ(folded.folded, 6u);
    EXPECT_EQ(bf16_casts(folded.graph), 0);
    EXPECT_EQ(rounding_matmuls(plain.graph), 0);
    EXPECT_GE(rounding_matmuls(folded.graph), 4);  // every product reads something rounded
    EXPECT_LT(folded.graph.size(), plain.graph.size());
    plain.run(threads);
    folded.run(threads);
    expect_identical(plain, folded, false);
  }
}

TEST(CastFolding, ForwardCastWhoseSourceWouldLiveLongerStays) {
  FoldNet plain(false, true), folded(true, true);
  // x * 2 is read by its cast alone; folding would keep it f32 until the
  // backward (w3's gradient), so that cast stays and the product reads bf16.
  EXPECT_EQ(bf16_casts(plain.graph), 9);
  EXPECT_EQ(bf16_casts(folded.graph), 1);
  const TensorNode* kept = nullptr;
  for (const TensorNode* n : folded.graph.nodes())
    if (n->op == Op::COPY && n->dtype == bf16) kept = n;
  ASSERT_NE(kept, nullptr);
  EXPECT_EQ(kept->src[0]->op, Op::SCALE);
  plain.run(2);
  folded.run(2);
  expect_identical(plain, folded, true);
}

TEST(CastFolding, CastsWithOtherReadersAndF32GraphsAreLeftAlone) {
  Context ctx;
  ctx.set_matmul_precision(bf16);
  Tensor x = ctx.input(f32, {8, 16}, "x"), w = ctx.param(f32, {16, 4}, "w");
  Tensor xb = x.to(bf16);  // read by the product and by a sum: stays
  Tensor loss = sum(matmul(xb, w)) + sum(xb.to(f32));
  Graph g = Graph::forward(loss);
  g.backward(loss);
  const int before = bf16_casts(g);
  g.fold_bf16_casts();
  EXPECT_GE(bf16_casts(g), 1);
  EXPECT_LT(bf16_casts(g), before + 1);

  Context c32;
  Tensor a = c32.input(f32, {8, 16}, "a"), v = c32.param(f32, {16, 4}, "v");
  Tensor l32 = sum(matmul(a, v));
  Graph g32 = Graph::forward(l32);
  g32.backward(l32);
  EXPECT_EQ(g32.fold_bf16_casts(), 0u);
  EXPECT_EQ(rounding_matmuls(g32), 0);
}

// A cast of a strided view (other than a permutation of a whole tensor, which
// the bf16 policy casts before permuting) is a dense copy. Folded, the product
// would read the view's strides instead, and gemm picks its path by layout:
// here the copy (rows contiguous) takes the few-columns dot products and the
// view (columns contiguous) the blocked path's FMA chains, which sum in another
// order on every instruction set. Such a cast stays; the bits are the same.
TEST(CastFolding, CastOfAStridedViewStays) {
  std::vector<float> y[2];
  for (int fold = 0; fold < 2; ++fold) {
    Context ctx;
    ctx.set_matmul_precision(bf16);
    Tensor x = ctx.input(f32, {200, 12}, "x"), w = ctx.param(f32, {200, 3}, "w");
    Tensor p = matmul(x.narrow(1, 0, 10).T(), w);  // [10, 200] @ [200, 3]
    Graph g = Graph::forward(p);
    if (fold) {
      EXPECT_EQ(g.fold_bf16_casts(), 1u);  // w's cast only
    }
    auto buf = kiln_test::run_filled(ctx, g, {x, w}, 1);
    y[fold] = p.get<float>();
  }
  EXPECT_TRUE(same_bits(y[0], y[1]));
}

// Two pre-LN transformer blocks under the bf16 policy trained by an OptContext:
// the same losses and parameters, bit for bit, with the casts folded into the
// products and without (GraphPass::fold_casts alone; the cast fusion runs in
// both, GELU's bf16 input, which changes values, in neither).
TEST(CastFolding, OptContextTrainsTransformerBlocksIdentically) {
  using kiln_test::training_passes_without;
  for (int threads : {1, 2}) {
    SCOPED_TRACE(threads);
    kiln_test::TwoBlockRun run[2];
    int casts[2] = {0, 0}, rounding[2] = {0, 0};
    for (int fold = 0; fold < 2; ++fold)
      run[fold] = kiln_test::train_two_blocks(
          bf16, threads,
          fold ? training_passes_without({GraphPass::bf16_gelu_inputs})
               : training_passes_without({GraphPass::bf16_gelu_inputs, GraphPass::fold_casts}),
          [&](const Graph& g) {
            casts[fold] = bf16_casts(g);
            rounding[fold] = rounding_matmuls(g);
          });
    EXPECT_EQ(rounding[0], 0);
    EXPECT_GT(rounding[1], 0);
    EXPECT_LT(casts[1], casts[0]);
    EXPECT_EQ(run[0].losses, run[1].losses);        // exact
    EXPECT_NE(run[1].losses[0], run[1].losses[2]);  // it trained
    ASSERT_EQ(run[0].params.size(), run[1].params.size());
    for (size_t i = 0; i < run[0].params.size(); ++i)
      EXPECT_TRUE(same_bits(run[0].params[i], run[1].params[i])) << "param " << i;
  }
}

}  // namespace
}  // namespace kiln::test
