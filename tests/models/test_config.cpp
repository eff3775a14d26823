// config.json files shaped as the hub's are for the supported families (every
// field they carry is either used or known to be harmless), and the values land
// in the typed config.
#include "models_test_util.h"

namespace kiln::test {
namespace {

TEST(ModelConfigParse, Llama32Shape) {
  const auto c = models::parse_config(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": 128001, "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192,
    "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 16, "num_key_value_heads": 8,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.45.0.dev0", "use_cache": true, "vocab_size": 128256})");
  ASSERT_TRUE(c.llama);
  EXPECT_EQ(c.llama->head_dim, 64);
  EXPECT_EQ(c.llama->num_key_value_heads, 8);
  EXPECT_EQ(c.llama->rope_theta, 500000.0);
  EXPECT_EQ(c.llama->rope_scaling->factor, 32.0);
  EXPECT_TRUE(c.llama->tie_word_embeddings);
  EXPECT_EQ(c.generation.eos_token_ids, std::vector<int64_t>{128001});
  EXPECT_EQ(c.generation.bos_token_id, 128000);
}

TEST(ModelConfigParse, Qwen25Qwen3MistralShapes) {
  const auto q2 = models::parse_config(R"({
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151645, "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02,
    "intermediate_size": 4864, "max_position_embeddings": 32768, "max_window_layers": 21,
    "model_type": "qwen2", "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
    "transformers_version": "4.43.1", "use_cache": true, "use_sliding_window": false,
    "vocab_size": 151936})");
  EXPECT_TRUE(q2.llama->qkv_bias);
  EXPECT_FALSE(q2.llama->o_bias);
  EXPECT_EQ(q2.llama->head_dim, 64);
  EXPECT_EQ(q2.llama->sliding_window, 0);

  const auto q3 = models::parse_config(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 1024, "initializer_range": 0.02, "intermediate_size": 3072,
    "max_position_embeddings": 40960, "max_window_layers": 28, "model_type": "qwen3",
    "num_attention_heads": 16, "num_hidden_layers": 28, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
  EXPECT_TRUE(q3.llama->qk_norm);
  EXPECT_EQ(q3.llama->head_dim, 128);  // not hidden / heads (64)
  EXPECT_EQ(q3.llama->rope_theta, 1e6);

  const auto m = models::parse_config(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.34.0.dev0",
    "use_cache": true, "vocab_size": 32000})");
  EXPECT_EQ(m.llama->sliding_window, 4096);
  EXPECT_FALSE(m.llama->tie_word_embeddings);
}

TEST(ModelConfigParse, Gpt2Shape) {
  const auto g = models::parse_config(R"({
    "activation_function": "gelu_new", "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1,
    "bos_token_id": 50256, "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1,
    "summary_activation": null, "summary_first_dropout": 0.1, "summary_proj_to_labels": true,
    "summary_type": "cls_index", "summary_use_proj": true,
    "task_specific_params": {"text-generation": {"do_sample": true, "max_length": 50}},
    "vocab_size": 50257})");
  ASSERT_TRUE(g.gpt2);
  EXPECT_EQ(g.gpt2->n_embd, 768);
  EXPECT_FLOAT_EQ(g.gpt2->attn_pdrop, 0.1f);
  EXPECT_EQ(g.generation.eos_token_ids, std::vector<int64_t>{50256});
}

// config_json writes what parse_config reads back to the same config.
TEST(ModelConfigParse, WrittenConfigsReadBack) {
  for (const char* name : {"llama3_gqa", "llama_tied_bf16", "qwen2_bias", "qwen3_qknorm_f16",
                           "mistral_swa", "phi3_longrope", "gpt2"}) {
    const models::ModelConfig c = models::read_config(fixture_dir(name) + "/config.json");
    const std::string text = models::config_json(c);
    EXPECT_EQ(models::config_json(models::parse_config(text, "written")), text) << name;
  }
}

}  // namespace
}  // namespace kiln::test
