// Every fixture's logits (PyTorch reference, float64) equal kiln's within 1e-4
// of their scale, loaded from the Hugging Face directory.
#include "models_test_util.h"

namespace kiln::test {
namespace {

class ModelLogits : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelLogits, MatchTheReference) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam()));
  Expected e(GetParam());
  const double err = rel_error(run_logits(ctx, *model, e), e.floats("logits"));
  EXPECT_LT(err, 1e-4) << GetParam();
  RecordProperty("relative_error", std::to_string(err));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelLogits,
                         ::testing::Values("llama3_gqa", "llama_tied_bf16", "qwen2_bias",
                                           "qwen3_qknorm_f16", "mistral_swa", "llama_yarn",
                                           "llama_linear", "phi3_longrope", "gpt2"));

// The feature each fixture is about is in the config kiln read.
TEST(ModelConfigRead, FixtureVariants) {
  auto cfg = [](const char* name) {
    return models::read_config(fixture_dir(name) + "/config.json");
  };
  const models::ModelConfig l3 = cfg("llama3_gqa");
  ASSERT_TRUE(l3.llama);
  EXPECT_EQ(l3.llama->num_key_value_heads, 2);
  ASSERT_TRUE(l3.llama->rope_scaling);
  EXPECT_EQ(l3.llama->rope_scaling->factor, 8.0);
  EXPECT_EQ(l3.llama->rope_scaling->original_max_position_embeddings, 64);
  EXPECT_FALSE(l3.llama->tie_word_embeddings);
  EXPECT_EQ(l3.generation.eos_token_ids, (std::vector<int64_t>{2, 3}));
  EXPECT_TRUE(cfg("llama_tied_bf16").llama->tie_word_embeddings);
  EXPECT_TRUE(cfg("qwen2_bias").llama->qkv_bias);
  EXPECT_FALSE(cfg("qwen2_bias").llama->o_bias);
  EXPECT_TRUE(cfg("qwen3_qknorm_f16").llama->qk_norm);
  EXPECT_EQ(cfg("qwen3_qknorm_f16").llama->head_dim, 12);
  EXPECT_EQ(cfg("mistral_swa").llama->sliding_window, 5);
  using RT = models::RopeScaling::Type;
  EXPECT_EQ(cfg("llama_yarn").llama->rope_scaling->type, RT::yarn);
  EXPECT_EQ(cfg("llama_linear").llama->rope_scaling->type, RT::linear);
  const models::ModelConfig phi = cfg("phi3_longrope");
  ASSERT_TRUE(phi.llama);
  EXPECT_TRUE(phi.llama->fused_projections);
  EXPECT_EQ(phi.llama->head_dim, 16);
  EXPECT_EQ(phi.llama->rope_dims(), 12);  // partial_rotary_factor 0.75
  ASSERT_TRUE(phi.llama->rope_scaling);
  EXPECT_EQ(phi.llama->rope_scaling->type, RT::longrope);
  // Phi-3's top-level original_max_position_embeddings, and the factor it implies.
  EXPECT_EQ(phi.llama->rope_scaling->original_max_position_embeddings, 64);
  EXPECT_EQ(phi.llama->rope_scaling->factor, 4.0);
  EXPECT_EQ(phi.llama->rope_scaling->long_factor.size(), 6u);
  const models::ModelConfig g = cfg("gpt2");
  ASSERT_TRUE(g.gpt2);
  EXPECT_EQ(g.gpt2->n_positions, 16);
  EXPECT_TRUE(g.gpt2->gelu_tanh);
}

// HF names map 1:1: the model's parameters are exactly the file's tensors (a
// tied head appears once, as the embedding).
TEST(ModelNames, ParametersAreTheFilesTensors) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("qwen3_qknorm_f16"));
  SafetensorsFile f(fixture_dir("qwen3_qknorm_f16") + "/model.safetensors");
  std::vector<std::string> file_names, model_names;
  for (const TensorInfo& t : f.tensors()) file_names.push_back(t.name);
  for (const auto& [n, t] : model->named_parameters()) model_names.push_back(n);
  std::sort(file_names.begin(), file_names.end());
  std::sort(model_names.begin(), model_names.end());
  EXPECT_EQ(model_names, file_names);
  EXPECT_EQ(model->parameter("model.layers.1.self_attn.q_norm.weight").shape(), Shape({12}));
  EXPECT_EQ(model->parameter("model.layers.0.self_attn.q_proj.weight").shape(), Shape({48, 32}));
  EXPECT_EQ(model->parameter("model.layers.0.self_attn.k_proj.weight").shape(), Shape({12, 32}));
}

TEST(ModelLoad, ReportsTimeAndMemory) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  EXPECT_GT(model->load_stats.bytes_read, 0);
  EXPECT_GT(model->load_stats.seconds, 0.0);
  EXPECT_GT(model->load_stats.peak_rss_bytes, 0);
}

}  // namespace
}  // namespace kiln::test
