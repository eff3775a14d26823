// Every layer's output and gradients (params and input) against a double
// reference (tests/nn/reference.h), gradients by central differences.
#include <cmath>
#include <map>
#include <set>

#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"
#include "nn_test_util.h"
#include "reference.h"

namespace kiln::test {
namespace {

using nn::Module;

// Leaves: x first, then the module's params in named_parameters() order.
std::vector<Tensor> leaves_of(Tensor x, const Module& m) {
  std::vector<Tensor> l;
  if (x.defined()) l.push_back(x);
  for (Tensor p : m.parameters()) l.push_back(p);
  return l;
}

TEST(NnLayers, LinearOn2dAnd3dInputs) {
  for (bool bias : {true, false}) {
    Context ctx;
    nn::Linear lin(ctx, 5, 3, bias);
    Tensor x = ctx.param(f32, {2, 4, 5}, "x");  // [..., in] with two leading dims
    Tensor y = lin(x);
    ASSERT_EQ(y.shape(), Shape({2, 4, 3}));
    check_layer(
        ctx, y, leaves_of(x, lin), {x},
        [&](const std::vector<Values>& v) {
          return ref::linear(v[0], 8, 5, v[1], bias ? v[2] : Values{}, 3);
        },
        1e-4, 1e-3, [&] { lin.init(1); });
  }
}

TEST(NnLayers, Conv2dWithStrideAndPadding) {
  Context ctx;
  Conv2dOptions o;
  o.stride[0] = o.stride[1] = 2;
  o.padding[0] = o.padding[1] = 1;
  nn::Conv2d conv(ctx, 2, 3, 3, o);
  Tensor x = ctx.param(f32, {2, 2, 5, 5}, "x");
  Tensor y = conv(x);
  ASSERT_EQ(y.shape(), Shape({2, 3, 3, 3}));
  check_layer(
      ctx, y, leaves_of(x, conv), {x},
      [&](const std::vector<Values>& v) {
        int64_t oh, ow;
        return ref::conv2d(v[0], 2, 2, 5, 5, v[1], v[2], 3, 3, 2, 1, &oh, &ow);
      },
      1e-4, 1e-3, [&] { conv.init(2); });
}

TEST(NnLayers, EmbeddingGathersRowsAndSumsRepeatedGrads) {
  Context ctx;
  nn::Embedding emb(ctx, 6, 4);
  Tensor idx = ctx.input(i32, {2, 3}, "idx");
  Tensor y = emb(idx);
  ASSERT_EQ(y.shape(), Shape({2, 3, 4}));
  const std::vector<int32_t> ids = {0, 5, 2, 2, 5, 1};  // repeats: summed gradients
  check_layer(
      ctx, y, leaves_of({}, emb), {},
      [&](const std::vector<Values>& v) {
        Values out;
        for (int32_t id : ids)
          for (int d = 0; d < 4; ++d) out.push_back(v[0][size_t(id * 4 + d)]);
        return out;
      },
      1e-5, 1e-4,
      [&] {
        idx.set(ids);
        emb.init(3);
      });
}

TEST(NnLayers, LayerNormAndRmsNorm) {
  {
    Context ctx;
    nn::LayerNorm ln(ctx, 6);
    Tensor x = ctx.param(f32, {3, 6}, "x");
    Tensor y = ln(x);
    check_layer(
        ctx, y, leaves_of(x, ln), {x},
        [&](const std::vector<Values>& v) { return ref::layer_norm(v[0], 6, v[1], v[2], 1e-5); },
        1e-4, 1e-3,
        [&] {
          ln.init(4);
          // Not the default 1 / 0, so the affine part's gradients are exercised.
          ln.weight().set(random_values(6, 40));
          ln.bias().set(random_values(6, 41));
        });
  }
  {
    Context ctx;
    nn::RMSNorm rms(ctx, 6);
    Tensor x = ctx.param(f32, {3, 6}, "x");
    Tensor y = rms(x);
    check_layer(
        ctx, y, leaves_of(x, rms), {x},
        [&](const std::vector<Values>& v) { return ref::rms_norm(v[0], 6, v[1], 1e-6); }, 1e-4,
        1e-3, [&] { rms.weight().set(random_values(6, 42)); });
  }
}

TEST(NnLayers, SequentialChainsInOrder) {
  Context ctx;
  nn::Sequential seq(ctx);
  seq.push_back<nn::Linear>(4, 6);
  seq.push_back<nn::GELU>();
  seq.push_back<nn::Linear>(6, 2);
  Tensor x = ctx.param(f32, {3, 4}, "x");
  Tensor y = seq(x);
  check_layer(
      ctx, y, leaves_of(x, seq), {x},
      [&](const std::vector<Values>& v) {
        return ref::linear(ref::gelu(ref::linear(v[0], 3, 4, v[1], v[2], 6)), 3, 6, v[3], v[4], 2);
      },
      1e-4, 1e-3, [&] { seq.init(5); });
}

TEST(NnLayers, CausalSelfAttention) {
  Context ctx;
  const int64_t B = 2, T = 4, C = 8, H = 2;
  nn::CausalSelfAttention attn(ctx, C, H);
  Tensor x = ctx.param(f32, {B, T, C}, "x");
  Tensor y = attn(x);
  ASSERT_EQ(y.shape(), Shape({B, T, C}));
  check_layer(
      ctx, y, leaves_of(x, attn), {x},
      [&](const std::vector<Values>& v) {
        return ref::causal_self_attention(v[0], B, T, C, H, v[1], v[2], v[3], v[4]);
      },
      1e-4, 1e-3, [&] { attn.init(6); });
}

// The fused ATTENTION primitive, in training with dropout on the attention
// weights too (AttentionOptions::dropout, seeded by the module's step seed);
// eval builds it without dropout. SdpaOptions::composite builds matmul ->
// softmax -> dropout -> matmul, which draws the same mask: both give the same
// output. (The kernels' equality with the composite, gradients included:
// tests/ops/test_attention_dropout.cpp.)
TEST(NnLayers, CausalSelfAttentionUsesTheFusedKernelWithWeightDropout) {
  auto attention_node = [](Tensor y) -> const TensorNode* {
    const Graph g = Graph::forward(y);
    for (const TensorNode* n : g.nodes())
      if (n->op == Op::ATTENTION) return n;
    return nullptr;
  };
  Context ctx;
  Tensor x = ctx.input(f32, {2, 4, 8}, "x");
  nn::CausalSelfAttention plain(ctx, 8, 2), dropping(ctx, 8, 2, 0.1f);
  const TensorNode* a = attention_node(plain(x));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(op_params<Op::ATTENTION>(*a).keep, 1.0f);
  a = attention_node(dropping(x));  // training mode: dropout inside the kernel
  ASSERT_NE(a, nullptr);
  EXPECT_FLOAT_EQ(op_params<Op::ATTENTION>(*a).keep, 0.9f);
  EXPECT_TRUE(op_params<Op::ATTENTION>(*a).seeded);
  dropping.eval();
  a = attention_node(dropping(x));
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(op_params<Op::ATTENTION>(*a).keep, 1.0f);

  Tensor q = ctx.input(f32, {2, 2, 5, 4}, "q"), k = ctx.input(f32, {2, 2, 5, 4}, "k");
  Tensor v = ctx.input(f32, {2, 2, 5, 4}, "v"), step = ctx.input(i32, {1}, "step");
  nn::SdpaOptions o;
  o.dropout = 0.3f;
  o.training = true;
  o.seed = 99;
  o.seed_tensor = step;
  Tensor fused = nn::scaled_dot_product_attention(q, k, v, o);
  o.composite = true;
  Tensor composite = nn::scaled_dot_product_attention(q, k, v, o);
  Graph g = Graph::forward({fused, composite});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  for (Tensor t : {q, k, v}) {
    std::vector<float> r(size_t(t.numel()));
    for (size_t i = 0; i < r.size(); ++i) r[i] = std::sin(float(i) * 0.37f + float(t.numel()));
    t.set(r);
  }
  step.set(std::vector<int32_t>{4});
  cpu.compute(g);
  const std::vector<float> f = fused.get<float>(), c = composite.get<float>();
  ASSERT_EQ(f.size(), c.size());
  for (size_t i = 0; i < f.size(); ++i) EXPECT_NEAR(f[i], c[i], 2e-5) << i;
}

// q, k and v are slices of c_attn's output: the backward writes their three
// gradients into one tensor of its shape (ATTENTION_BACK), which is c_attn's
// output gradient itself: no concat, no padding, in f32 and under the bf16
// policy. (Values: CausalSelfAttention above and the op harness.)
TEST(NnLayers, CausalSelfAttentionGradientsJoinWithoutACopy) {
  for (const DType precision : {f32, bf16}) {
    Context ctx;
    ctx.set_matmul_precision(precision);
    Tensor x = ctx.input(f32, {2, 4, 8}, "x");
    nn::CausalSelfAttention attn(ctx, 8, 2);
    Tensor loss = sum(attn(x));
    Graph g = Graph::forward(loss);
    g.backward(loss);
    std::map<Op, int> n;
    const TensorNode* back = nullptr;
    for (size_t k = g.n_forward(); k < g.size(); ++k) {
      ++n[g.nodes()[k]->op];
      if (g.nodes()[k]->op == Op::ATTENTION_BACK) back = g.nodes()[k];
    }
    EXPECT_EQ(n[Op::CONCAT], 0) << dtype_name(precision);
    EXPECT_EQ(n[Op::PAD], 0) << dtype_name(precision);
    ASSERT_NE(back, nullptr);
    EXPECT_EQ(back->shape, (Shape{2, 4, 6, 4}));  // [B, T, 3H, D]
  }
}

TEST(NnLayers, TransformerBlock) {
  Context ctx;
  const int64_t B = 2, T = 3, C = 8, H = 2;
  nn::TransformerBlock block(ctx, C, H);
  Tensor x = ctx.param(f32, {B, T, C}, "x");
  Tensor y = block(x);
  // named_parameters order: ln_1.{weight,bias}, attn.c_attn.{w,b}, attn.c_proj.{w,b},
  // ln_2.{w,b}, mlp.c_fc.{w,b}, mlp.c_proj.{w,b}.
  check_layer(
      ctx, y, leaves_of(x, block), {x},
      [&](const std::vector<Values>& v) {
        Values h = v[0];
        const Values a = ref::causal_self_attention(ref::layer_norm(h, C, v[1], v[2], 1e-5), B, T,
                                                    C, H, v[3], v[4], v[5], v[6]);
        for (size_t i = 0; i < h.size(); ++i) h[i] += a[i];
        const Values m = ref::linear(ref::gelu(ref::linear(ref::layer_norm(h, C, v[7], v[8], 1e-5),
                                                           B * T, C, v[9], v[10], 4 * C)),
                                     B * T, 4 * C, v[11], v[12], C);
        for (size_t i = 0; i < h.size(); ++i) h[i] += m[i];
        return h;
      },
      2e-4, 2e-3,
      [&] {
        block.init(7);
        block.ln_1.weight().set(random_values(size_t(C), 43));
        block.ln_2.bias().set(random_values(size_t(C), 44));
      });
}

}  // namespace
}  // namespace kiln::test
