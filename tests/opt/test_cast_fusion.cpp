// Graph::fuse_bf16_casts: under the bf16 matmul policy, the casts of LayerNorm
// and GELU results (and of GELU's gradient) fold into those ops, which then
// store bf16 themselves; values and gradients stay bit-identical.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "common/graph_checks.h"
#include "common/random_values.h"
#include "common/two_block_training.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

using kiln_test::nodes_of;
using kiln_test::same_bits;
using kiln_test::uniform_floats;

// Casts to bf16 whose source is computed by `op`.
int casts_of(const Graph& g, Op op) {
  int n = 0;
  for (const TensorNode* t : g.nodes())
    n += t->op == Op::COPY && t->dtype == bf16 && t->src[0]->op == op;
  return n;
}

// x -> LayerNorm -> Linear -> GELU (erf or tanh) -> Linear, loss sum(y * t); with
// `extra_reader`, the LayerNorm result is also summed into the loss. `batched`:
// x is [B, T, D] and the norm and GELU run on [B, T, .], each reshaped to
// [B*T, .] for the products (as nn::Linear does).
struct CastMlp {
  static constexpr int64_t B = 3, T = 5, M = B * T, D = 70, H = 45, O = 19;  // M * H > 256
  Context ctx;
  Tensor x, lw, lb, w1, w2, t, a, y, loss;
  Graph graph;
  std::unique_ptr<Buffer> buf;
  size_t fused = 0;

  CastMlp(bool fuse, bool extra_reader, GeluApprox approx, bool batched = false) {
    ctx.set_matmul_precision(bf16);
    x = batched ? ctx.param(f32, {B, T, D}, "x") : ctx.param(f32, {M, D}, "x");
    lw = ctx.param(f32, {D}, "ln.w");
    lb = ctx.param(f32, {D}, "ln.b");
    w1 = ctx.param(f32, {H, D}, "w1");
    w2 = ctx.param(f32, {O, H}, "w2");
    t = ctx.input(f32, {M, O}, "t");
    Tensor h = layer_norm(x, lw, lb);
    a = matmul(h.reshape({M, D}), w1.T());
    if (batched) a = a.reshape({B, T, H});
    y = matmul(gelu(a, approx).reshape({M, H}), w2.T());
    loss = sum(y * t);
    if (extra_reader) loss = loss + sum(h);
    graph = Graph::forward(loss);
    graph.expand(y);
    graph.backward(loss);
    if (fuse) fused = graph.fuse_bf16_casts();
  }
  void run() {
    CpuBackend cpu(3);
    buf = allocate_tensors(ctx, cpu);
    x.set(uniform_floats(size_t(M * D), 1));
    lw.set(uniform_floats(size_t(D), 2));
    lb.set(uniform_floats(size_t(D), 3));
    w1.set(uniform_floats(size_t(H * D), 4));
    w2.set(uniform_floats(size_t(O * H), 5));
    t.set(uniform_floats(size_t(M * O), 6));
    graph.reset_grads();
    cpu.compute(graph);
  }
};

void expect_identical(CastMlp& a, CastMlp& b) {
  EXPECT_TRUE(same_bits(a.y.get<float>(), b.y.get<float>()));
  EXPECT_TRUE(same_bits(a.loss.get<float>(), b.loss.get<float>()));
  for (auto p : {&CastMlp::x, &CastMlp::lw, &CastMlp::lb, &CastMlp::w1, &CastMlp::w2})
    EXPECT_TRUE(same_bits(a.graph.grad(a.*p).get<float>(), b.graph.grad(b.*p).get<float>()))
        << (a.*p).label();
}

TEST(CastFusion, LayerNormAndGeluStoreBf16WithIdenticalResults) {
  for (GeluApprox approx : {GeluApprox::none, GeluApprox::tanh}) {
    const Op fwd = approx == GeluApprox::none ? Op::GELU_ERF : Op::GELU;
    const Op back = approx == GeluApprox::none ? Op::GELU_ERF_BACK : Op::GELU_BACK;
    CastMlp plain(false, false, approx), fused(true, false, approx);
    EXPECT_EQ(plain.fused, 0u);
    EXPECT_EQ(casts_of(plain.graph, Op::LAYER_NORM), 1);
    EXPECT_EQ(casts_of(plain.graph, fwd), 1);
    EXPECT_EQ(casts_of(plain.graph, back), 1);
    // The LayerNorm, GELU and GELU-gradient casts are gone: those ops write bf16.
    EXPECT_EQ(fused.fused, 3u);
    EXPECT_EQ(fused.graph.size() + 3, plain.graph.size());
    EXPECT_EQ(fused.graph.n_forward() + 2, plain.graph.n_forward());
    for (Op op : {Op::LAYER_NORM, fwd, back}) {
      EXPECT_EQ(casts_of(fused.graph, op), 0) << op_name(op);
      EXPECT_EQ(nodes_of(fused.graph, op, bf16), 1) << op_name(op);
      EXPECT_EQ(nodes_of(fused.graph, op, f32), 0) << op_name(op);
    }
    plain.run();
    fused.run();
    expect_identical(plain, fused);
  }
}

TEST(CastFusion, ThroughReshapesOfBatchedActivations) {
  CastMlp plain(false, false, GeluApprox::none, true), fused(true, false, GeluApprox::none, true);
  EXPECT_EQ(casts_of(plain.graph, Op::RESHAPE), 3);  // LayerNorm, GELU, GELU gradient
  // All three fuse: the norm, GELU and GELU's gradient write [B*T, .] bf16.
  EXPECT_EQ(fused.fused, 3u);
  EXPECT_EQ(casts_of(fused.graph, Op::RESHAPE), 0);
  EXPECT_EQ(nodes_of(fused.graph, Op::LAYER_NORM, bf16), 1);
  EXPECT_EQ(nodes_of(fused.graph, Op::GELU_ERF, bf16), 1);
  EXPECT_EQ(nodes_of(fused.graph, Op::GELU_ERF, f32), 0);
  EXPECT_EQ(nodes_of(fused.graph, Op::GELU_ERF_BACK, bf16), 1);
  plain.run();
  fused.run();
  expect_identical(plain, fused);
  // Graph::grad of the [B, T, H] pre-GELU activation was the f32 GELU gradient
  // the cast read through a reshape: now a [B, T, H] view of the bf16 one.
  const Tensor g32 = plain.graph.grad(plain.a), g16 = fused.graph.grad(fused.a);
  ASSERT_EQ(g16.dtype(), bf16);
  EXPECT_EQ(g16.shape(), g32.shape());
  const std::vector<float> want = g32.get<float>();
  const std::vector<uint16_t> got = g16.get<uint16_t>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(got[i], f32_to_bf16(want[i])) << i;
}

// A Linear's product with its bias, reshaped twice (into heads) and cast to
// bf16, as nn's attention reads c_attn's output: the MATMUL stores bf16 itself,
// in the reshaped node's shape; bit-identical values and gradients. (Its
// output gradient's cast stays: the bias gradient reads the f32 one.)
struct Proj {
  static constexpr int64_t B = 3, T = 7, M = B * T, D = 40, N = 48, O = 9;
  Context ctx;
  Tensor x, w, b, w2, t, y16, loss;
  Graph graph;
  std::unique_ptr<Buffer> buf;
  size_t fused = 0;

  explicit Proj(bool fuse) {
    ctx.set_matmul_precision(bf16);
    x = ctx.param(f32, {B, T, D}, "x");
    w = ctx.param(f32, {N, D}, "w");
    b = ctx.param(f32, {N}, "b");
    w2 = ctx.param(f32, {O, N}, "w2");
    t = ctx.input(f32, {M, O}, "t");
    Tensor y = (matmul(x.reshape({M, D}), w.T()) + b).reshape({B, T, N}).reshape({B, T, 4, N / 4});
    y16 = y.to(bf16);
    loss = sum(matmul(y16.reshape({M, N}), w2.T()) * t);
    graph = Graph::forward(loss);
    graph.expand(y16);
    graph.backward(loss);
    graph.fuse_matmul_bias();
    if (fuse) fused = graph.fuse_bf16_casts();
  }
  void run() {
    CpuBackend cpu(3);
    buf = allocate_tensors(ctx, cpu);
    x.set(uniform_floats(size_t(M * D), 1));
    w.set(uniform_floats(size_t(N * D), 2));
    b.set(uniform_floats(size_t(N), 3));
    w2.set(uniform_floats(size_t(O * N), 4));
    t.set(uniform_floats(size_t(M * O), 5));
    graph.reset_grads();
    cpu.compute(graph);
  }
};

TEST(CastFusion, MatmulStoresBf16ThroughReshapes) {
  Proj plain(false), fused(true);
  // x's, the product's and its gradient's (x is a param: never fused)
  EXPECT_EQ(casts_of(plain.graph, Op::RESHAPE), 3);
  EXPECT_EQ(fused.fused, 1u);
  EXPECT_EQ(casts_of(fused.graph, Op::RESHAPE), 2);
  EXPECT_EQ(nodes_of(fused.graph, Op::MATMUL, bf16), 1);
  plain.run();
  fused.run();
  EXPECT_EQ(plain.y16.get<uint16_t>(), fused.y16.get<uint16_t>());
  EXPECT_TRUE(same_bits(plain.loss.get<float>(), fused.loss.get<float>()));
  for (auto p : {&Proj::x, &Proj::w, &Proj::b, &Proj::w2})
    EXPECT_TRUE(
        same_bits(plain.graph.grad(plain.*p).get<float>(), fused.graph.grad(fused.*p).get<float>()))
        << (plain.*p).label();
}

// A batched product cast as it is (no reshape): the MATMUL stores its
// [B, M, N] result in bf16; the values are the cast's.
TEST(CastFusion, BatchedMatmulStoresBf16) {
  std::vector<float> out[2];
  for (int fuse = 0; fuse < 2; ++fuse) {
    Context ctx;
    Tensor a = ctx.input(f32, {4, 30, 50}, "a"), b = ctx.input(f32, {4, 50, 20}, "b");
    Tensor z = matmul(a, b).to(bf16).to(f32);  // (the bf16 product is no output: fusable)
    Graph g = Graph::forward(z);
    if (fuse) {
      EXPECT_EQ(g.fuse_bf16_casts(), 1u);
      EXPECT_EQ(nodes_of(g, Op::MATMUL, bf16), 1);
      EXPECT_EQ(casts_of(g, Op::MATMUL), 0);
    }
    CpuBackend cpu(2);
    auto buf = allocate_tensors(ctx, cpu);
    a.set(uniform_floats(size_t(4 * 30 * 50), 7));
    b.set(uniform_floats(size_t(4 * 50 * 20), 8));
    cpu.compute(g);
    out[fuse] = z.get<float>();
  }
  EXPECT_TRUE(same_bits(out[0], out[1]));
}

// An LM head's output gradient: cross-entropy's backward stores the bf16 copy
// the head's products read (through the [B, T, V] reshapes); bit-identical.
TEST(CastFusion, CrossEntropyGradientStoresBf16) {
  constexpr int64_t B = 2, T = 9, D = 16, V = 11, N = B * T;
  std::vector<float> out[2][3];
  for (int fuse = 0; fuse < 2; ++fuse) {
    Context ctx;
    ctx.set_matmul_precision(bf16);
    Tensor x = ctx.param(f32, {B, T, D}, "x"), w = ctx.param(f32, {V, D}, "w");
    Tensor labels = ctx.input(i32, {N}, "labels");
    Tensor logits = matmul(x.reshape({N, D}), w.T()).reshape({B, T, V});
    Tensor loss = cross_entropy(logits.reshape({N, V}), labels);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    if (fuse) {
      EXPECT_EQ(g.fuse_bf16_casts(), 1u);
      EXPECT_EQ(nodes_of(g, Op::CROSS_ENTROPY_BACK, bf16), 1);
      EXPECT_EQ(nodes_of(g, Op::CROSS_ENTROPY_BACK, f32), 0);
    }
    CpuBackend cpu(2);
    auto buf = allocate_tensors(ctx, cpu);
    x.set(uniform_floats(size_t(N * D), 1));
    w.set(uniform_floats(size_t(V * D), 2));
    std::vector<int32_t> lab(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) lab[size_t(i)] = int32_t((i * 7) % V);
    labels.set(lab);
    g.reset_grads();
    cpu.compute(g);
    out[fuse][0] = loss.get<float>();
    out[fuse][1] = g.grad(x).get<float>();
    out[fuse][2] = g.grad(w).get<float>();
  }
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(same_bits(out[0][k], out[1][k])) << k;
}

TEST(CastFusion, SourceWithAnotherReaderIsNotFused) {
  CastMlp plain(false, true, GeluApprox::none), fused(true, true, GeluApprox::none);
  // The LayerNorm result is also summed: it stays f32 and its cast stays.
  EXPECT_EQ(casts_of(fused.graph, Op::LAYER_NORM), 1);
  EXPECT_EQ(nodes_of(fused.graph, Op::LAYER_NORM, f32), 1);
  EXPECT_EQ(fused.fused, 2u);  // GELU and its gradient still fuse
  plain.run();
  fused.run();
  expect_identical(plain, fused);
}

TEST(CastFusion, OutputsAndF32GraphsAreLeftAlone) {
  Context ctx;
  ctx.set_matmul_precision(bf16);
  Tensor x = ctx.input(f32, {4, 8}, "x"), w = ctx.param(f32, {3, 8}, "w");
  Tensor h = gelu(x);
  Tensor y = matmul(h, w.T());
  Graph g = Graph::forward({y, h});  // h is an output: its f32 values are wanted
  EXPECT_EQ(g.fuse_bf16_casts(), 0u);
  EXPECT_EQ(casts_of(g, Op::GELU_ERF), 1);

  Context c32;  // the f32 policy makes no casts
  Tensor a = c32.input(f32, {4, 8}, "a"), v = c32.param(f32, {3, 8}, "v");
  Graph g32 = Graph::forward(matmul(layer_norm(a), v.T()));
  const size_t n = g32.size();
  EXPECT_EQ(g32.fuse_bf16_casts(), 0u);
  EXPECT_EQ(g32.size(), n);
}

// An OptContext on the CPU backend runs the pass: two pre-LN transformer blocks
// train to bit-identical losses with it and without (GraphPass::fuse_casts
// and fold_casts, which needs it; GELU's bf16 input, which needs it too and
// changes values, is off in both runs).
TEST(CastFusion, OptContextTrainsIdenticallyWithTheCastsFused) {
  using kiln_test::training_passes_without;
  kiln_test::TwoBlockRun run[2];
  int casts[2] = {0, 0}, bf16_norms[2] = {0, 0};
  for (int fuse = 0; fuse < 2; ++fuse)
    run[fuse] = kiln_test::train_two_blocks(
        bf16, 2,
        fuse ? training_passes_without({GraphPass::bf16_gelu_inputs})
             : training_passes_without(
                   {GraphPass::bf16_gelu_inputs, GraphPass::fuse_casts, GraphPass::fold_casts}),
        [&](const Graph& g) {
          for (const TensorNode* n : g.nodes()) {
            casts[fuse] += n->op == Op::COPY && n->dtype == bf16;
            bf16_norms[fuse] += n->op == Op::LAYER_NORM && n->dtype == bf16;
          }
        });
  EXPECT_EQ(bf16_norms[0], 0);
  EXPECT_EQ(bf16_norms[1], 4);  // two norms per block
  EXPECT_LT(casts[1], casts[0]);
  EXPECT_EQ(run[0].losses, run[1].losses);        // exact
  EXPECT_NE(run[1].losses[0], run[1].losses[2]);  // it trained
}

}  // namespace
}  // namespace kiln::test
