// LoRA on kiln::nn modules (kiln/nn/lora.h): PEFT's names, init and target
// rule, the adapted layer's output, dropout per mode, merge, and the memory a
// frozen base with an adapter saves in an OptContext.
#include <cmath>
#include <cstdio>

#include "../common/error_check.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/nn/lora.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

struct Net : nn::Module {
  nn::Linear& fc1;
  nn::Linear& fc2;
  Net(Context& ctx, int64_t in, int64_t hidden, int64_t out)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", in, hidden)),
        fc2(add<nn::Linear>("fc2", hidden, out)) {}
  Tensor forward(Tensor x) override { return fc2(relu(fc1(x))); }
};

TEST(NnLora, TargetsMatchAsPeftMatchesThem) {
  nn::LoraConfig c;
  c.target_modules = {"q_proj", "mlp.c_proj"};
  EXPECT_TRUE(nn::lora_matches(c, "model.layers.0.self_attn.q_proj"));
  EXPECT_TRUE(nn::lora_matches(c, "q_proj"));
  EXPECT_TRUE(nn::lora_matches(c, "h.1.mlp.c_proj"));
  EXPECT_FALSE(nn::lora_matches(c, "h.1.attn.c_proj"));
  EXPECT_FALSE(nn::lora_matches(c, "model.layers.0.self_attn.xq_proj"));
  c.target_regex = R"(.*\.(0|1)\.self_attn\.(q|v)_proj)";
  EXPECT_TRUE(nn::lora_matches(c, "model.layers.1.self_attn.v_proj"));
  EXPECT_FALSE(nn::lora_matches(c, "model.layers.2.self_attn.v_proj"));
  EXPECT_FALSE(nn::lora_matches(c, "q_proj"));  // the regex replaces the list
  c.r = 16;
  c.alpha = 32;
  EXPECT_FLOAT_EQ(c.scaling(), 2.0f);
  c.use_rslora = true;
  EXPECT_FLOAT_EQ(c.scaling(), 8.0f);
}

// PEFT's names and init: A kaiming-uniform, B zero (so the adapted model starts
// as the base); only the adapter trains; the layer computes
// x W^T + b + (alpha/r) (x A^T) B^T; merge gives the same output.
TEST(NnLora, AdaptedLayerOutputNamesAndMerge) {
  Context ctx;
  CpuBackend cpu(1);
  Net net(ctx, 6, 10, 3);
  net.allocate(cpu);
  net.init(4);
  Tensor x = ctx.input(f32, {5, 6}, "x");
  net.eval();
  Tensor y0 = net(x);
  nn::LoraConfig cfg;
  cfg.r = 2;
  cfg.alpha = 3;
  cfg.target_modules = {"fc1"};
  EXPECT_EQ(nn::add_lora(net, cpu, cfg), std::vector<std::string>{"fc1"});
  std::vector<std::string> names;
  for (const auto& [n, p] : net.named_parameters()) names.push_back(n);
  EXPECT_EQ(names,
            (std::vector<std::string>{"fc1.weight", "fc1.bias", "fc1.lora_A.default.weight",
                                      "fc1.lora_B.default.weight", "fc2.weight", "fc2.bias"}));
  EXPECT_EQ(net.named_base_parameters().size(), 4u);
  const std::vector<Tensor> trainable = net.trainable_parameters();
  ASSERT_EQ(trainable.size(), 2u);
  EXPECT_EQ(trainable[0].name(), "fc1.lora_A.default.weight");
  const nn::LinearBase::Lora& a = *net.fc1.find_lora("default");
  EXPECT_EQ(a.A->weight().shape(), Shape({2, 6}));
  EXPECT_EQ(a.B->weight().shape(), Shape({10, 2}));
  const float bound = 1.0f / std::sqrt(6.0f);
  float amax = 0;
  for (float v : a.A->weight().get<float>()) amax = std::max(amax, std::fabs(v));
  EXPECT_LE(amax, bound);
  EXPECT_GT(amax, 0.5f * bound);
  for (float v : a.B->weight().get<float>()) EXPECT_EQ(v, 0.0f);

  Tensor y1 = net(x);  // built after add_lora: with the adapter
  a.B->weight().set(random_values(20, 7));
  Graph g = Graph::forward({y0, y1});
  auto buf = allocate_tensors(ctx, cpu);
  const std::vector<float> xv = random_values(30, 8);
  x.set(xv);
  cpu.compute(g);
  // Reference in double.
  const Values W1 = as_double(net.fc1.weight()), b1 = as_double(net.fc1.bias());
  const Values A = as_double(a.A->weight()), B = as_double(a.B->weight());
  const Values W2 = as_double(net.fc2.weight()), b2 = as_double(net.fc2.bias());
  Values want(15);
  for (int n = 0; n < 5; ++n) {
    double h[10], ax[2] = {0, 0};
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < 6; ++i) ax[k] += A[size_t(k * 6 + i)] * xv[size_t(n * 6 + i)];
    for (int o = 0; o < 10; ++o) {
      double s = b1[size_t(o)];
      for (int i = 0; i < 6; ++i) s += W1[size_t(o * 6 + i)] * xv[size_t(n * 6 + i)];
      for (int k = 0; k < 2; ++k) s += 1.5 * B[size_t(o * 2 + k)] * ax[k];
      h[o] = std::max(s, 0.0);
    }
    for (int o = 0; o < 3; ++o) {
      double s = b2[size_t(o)];
      for (int i = 0; i < 10; ++i) s += W2[size_t(o * 10 + i)] * h[i];
      want[size_t(n * 3 + o)] = s;
    }
  }
  expect_close(as_double(y1), want, 1e-5, 1e-5, "adapted output");
  EXPECT_NE(y0.get<float>(), y1.get<float>());  // y0's graph was built before: no adapter

  nn::merge_lora(net);
  Tensor y2 = net(x);
  Graph g2 = Graph::forward(y2);
  for (const TensorNode* l : g2.leafs())  // merged: the adapter's params are not read
    EXPECT_EQ(l->name.find("lora_"), std::string::npos) << l->name;
  auto buf2 = allocate_tensors(ctx, cpu);
  x.set(xv);
  cpu.compute(g2);
  expect_close(as_double(y2), want, 1e-5, 1e-5, "merged output");
}

// lora_dropout acts on the adapter's input in training graphs only, with a
// step seed OptContext writes.
TEST(NnLora, DropoutOnlyInTrainingGraphs) {
  Context ctx;
  CpuBackend cpu(1);
  Net net(ctx, 4, 8, 2);
  net.allocate(cpu);
  nn::LoraConfig cfg;
  cfg.target_modules = {"fc1", "fc2"};
  cfg.dropout = 0.1f;
  nn::add_lora(net, cpu, cfg);
  EXPECT_EQ(net.dropout_seeds().size(), 0u);
  auto count_masks = [](const Graph& g) {
    int n = 0;
    for (const TensorNode* t : g.nodes()) n += t->op == Op::RAND_MASK;
    return n;
  };
  Tensor x = ctx.input(f32, {3, 4});
  EXPECT_EQ(count_masks(Graph::forward(net(x))), 2);
  EXPECT_EQ(net.dropout_seeds().size(), 2u);
  net.eval();
  EXPECT_EQ(count_masks(Graph::forward(net(x))), 0);
}

TEST(NnLora, Errors) {
  Context ctx;
  CpuBackend cpu(1);
  Net net(ctx, 4, 8, 2);
  net.allocate(cpu);
  nn::LoraConfig cfg;
  EXPECT_KILN_ERROR(nn::add_lora(net, cpu, cfg), "lora", "no target modules");
  cfg.target_modules = {"fc3"};
  EXPECT_KILN_ERROR(nn::add_lora(net, cpu, cfg), "lora", "no module", "fc3");
  cfg.target_modules = {"fc1"};
  EXPECT_KILN_ERROR(nn::add_lora(net, cpu, cfg, "a.b"), "lora", "'a.b'", "no '.'");
  cfg.dropout = 1.0f;
  EXPECT_KILN_ERROR(nn::add_lora(net, cpu, cfg), "lora", "lora_dropout", "[0, 1)");
  EXPECT_KILN_ERROR(nn::merge_lora(net), "lora", "no active adapter");
  EXPECT_KILN_ERROR(nn::lora_config(net, "default"), "lora", "no adapter 'default'");
}

// Gradient and optimizer memory of an OptContext on a stack of transformer
// blocks: full training vs a frozen base with LoRA (r 8) on the attention and
// MLP projections. The figures are printed for docs/design.md.
TEST(NnLora, FrozenBaseSavesGradientAndOptimizerMemory) {
  struct Stack : nn::Module {
    nn::Sequential& blocks;
    explicit Stack(Context& ctx) : Module(ctx), blocks(add<nn::Sequential>("blocks")) {
      for (int i = 0; i < 4; ++i) blocks.push_back<nn::TransformerBlock>(256, 4);
    }
    Tensor forward(Tensor x) override { return blocks(x); }
  };
  size_t bytes[2][2] = {};
  int64_t trained[2] = {};
  for (int lora = 0; lora < 2; ++lora) {
    Context ctx;
    CpuBackend cpu(1);
    Stack m(ctx);
    m.allocate(cpu);
    m.init(1);
    if (lora) {
      nn::LoraConfig cfg;
      cfg.r = 8;
      cfg.alpha = 16;
      cfg.target_modules = {"c_attn", "c_proj", "c_fc"};
      nn::add_lora(m, cpu, cfg);
    }
    for (Tensor p : m.trainable_parameters()) trained[lora] += p.numel();
    Tensor x = ctx.input(f32, {4, 64, 256}, "x");
    OptConfig oc;
    oc.inputs = x;
    oc.outputs = m(x);
    oc.loss = LossKind::mse;
    oc.model = &m;
    oc.backends = {&cpu};
    OptContext opt(oc);
    bytes[lora][0] = opt.static_bytes();
    bytes[lora][1] = opt.memory_plan().buffer_size;
  }
  std::printf(
      "full: %lld params trained, static (grads, AdamW state, inputs) %.2f MB, planned %.2f MB\n"
      "lora: %lld params trained, static %.2f MB, planned %.2f MB\n",
      (long long)trained[0], bytes[0][0] / 1e6, bytes[0][1] / 1e6, (long long)trained[1],
      bytes[1][0] / 1e6, bytes[1][1] / 1e6);
  // Gradients + m + v: 12 bytes per trained param, plus the inputs and labels.
  EXPECT_LT(bytes[1][0], bytes[0][0] / 10);
  EXPECT_GE(bytes[0][0], size_t(12 * trained[0]));
}

}  // namespace
}  // namespace kiln::test
