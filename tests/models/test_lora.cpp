// LoRA adapters in PEFT's layout on the fixture models: logits, gradients and
// one AdamW step against the reference of tests/models/make_lora_fixtures.py
// (LoRA written from the paper in PyTorch, float64).
#include <filesystem>
#include <fstream>
#include <iterator>

#include "../common/error_check.h"
#include "../common/temp_dir.h"
#include "kiln/lora.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

struct LoraCase {
  const char* adapter;
  const char* base;
};

class LoraFixture : public ::testing::TestWithParam<LoraCase> {};

// A PEFT-layout adapter file loads and gives the reference's logits.
TEST_P(LoraFixture, LogitsMatchTheReference) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam().base));
  Expected e(GetParam().adapter);
  const std::vector<float> plain = run_logits(ctx, *model, e);
  models::load_lora(*model, cpu, fixture_dir(GetParam().adapter));
  EXPECT_EQ(nn::active_lora_adapter(*model), "default");
  const std::vector<float> got = run_logits(ctx, *model, e);
  EXPECT_LT(rel_error(got, e.floats("logits")), 1e-4);
  EXPECT_GT(rel_error(plain, e.floats("logits")), 1e-2);  // the adapter matters
  // Off again: the base model's logits, nothing reloaded.
  nn::set_lora_adapter(*model, "");
  EXPECT_EQ(run_logits(ctx, *model, e), plain);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraFixture,
                         ::testing::Values(LoraCase{"lora_llama3_gqa", "llama3_gqa"},
                                           LoraCase{"lora_llama3_gqa_rslora", "llama3_gqa"},
                                           LoraCase{"lora_gpt2", "gpt2"}),
                         [](const auto& info) { return std::string(info.param.adapter); });

class LoraTraining : public ::testing::TestWithParam<LoraCase> {};

// The loss, the gradient of every adapter tensor and one AdamW step through an
// OptContext given the model equal the reference; the frozen base gets no
// gradient and does not change.
TEST_P(LoraTraining, GradientsAndOneAdamWStepMatchTheReference) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam().base));
  models::load_lora(*model, cpu, fixture_dir(GetParam().adapter));
  Expected e(GetParam().adapter);
  const std::vector<int64_t> d = e.dims("input_ids");
  const int64_t B = d[0], T = d[1], V = model->vocab_size();
  model->eval();  // the fixtures' models and adapters have no dropout
  Tensor ids = ctx.input(i32, {B, T}, "input_ids");
  Tensor labels = ctx.input(i32, {B * T}, "labels");
  Tensor logits = (*model)(ids);
  OptConfig cfg;
  cfg.inputs = ids;
  cfg.outputs = logits;
  cfg.loss = LossKind::user;
  cfg.user_loss = cross_entropy(logits.reshape({B * T, V}), labels);
  cfg.model = model.get();
  cfg.backends = {&cpu};
  OptimizerParams hp;
  hp.adamw.lr = 1e-2f;
  hp.adamw.beta1 = 0.9f;
  hp.adamw.beta2 = 0.999f;
  hp.adamw.eps = 1e-8f;
  hp.adamw.weight_decay = 0.01f;
  cfg.schedule = schedule::constant(hp);
  OptContext opt(cfg);

  // The adapter's tensors by the file's names (PEFT's), and the base's.
  const auto layers = nn::lora_layers(*model, "default");
  std::vector<std::pair<std::string, Tensor>> adapter;
  for (const std::string& n : e.names())
    if (n.rfind("grad.", 0) == 0) adapter.emplace_back(n.substr(5), Tensor());
  ASSERT_EQ(adapter.size(), 2 * layers.size());
  const std::string gpt2_prefix = std::string(GetParam().base) == "gpt2" ? "transformer." : "";
  for (auto& [name, t] : adapter)
    for (const auto& [path, layer] : layers) {
      const std::string base = "base_model.model." + gpt2_prefix + path;
      const nn::LinearBase::Lora& a = *layer->find_lora("default");
      if (name == base + ".lora_A.weight") t = a.A->weight();
      if (name == base + ".lora_B.weight") t = a.B->weight();
    }
  for (auto& [name, t] : adapter) ASSERT_TRUE(t.defined()) << name;
  const std::vector<Tensor> trained = model->trainable_parameters();
  EXPECT_EQ(trained.size(), adapter.size());
  std::vector<std::vector<float>> base_before;
  for (const auto& [n, p] : model->named_base_parameters()) {
    EXPECT_FALSE(opt.graph().grad(p).defined()) << "frozen " << n << " has a gradient";
    base_before.push_back(p.get<float>());
  }

  ids.set(e.ints("input_ids"));
  labels.set(e.ints("labels"));
  opt.forward_backward();
  EXPECT_LT(rel_error(logits.get<float>(), e.floats("logits")), 1e-4);
  EXPECT_NEAR(opt.loss().item(), e.floats("loss")[0], 1e-5 * std::fabs(e.floats("loss")[0]));
  for (auto& [name, t] : adapter)
    EXPECT_LT(rel_error(opt.graph().grad(t).get<float>(), e.floats("grad." + name)), 1e-4) << name;
  opt.optimizer_step();
  for (auto& [name, t] : adapter)
    EXPECT_LT(rel_error(t.get<float>(), e.floats("step." + name)), 1e-5) << name;
  size_t i = 0;
  for (const auto& [n, p] : model->named_base_parameters())
    EXPECT_EQ(p.get<float>(), base_before[i++]) << n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraTraining,
                         ::testing::Values(LoraCase{"lora_llama3_gqa", "llama3_gqa"},
                                           LoraCase{"lora_gpt2", "gpt2"}),
                         [](const auto& info) { return std::string(info.param.adapter); });

}  // namespace
}  // namespace kiln::test
