// kiln_arch_model: writes a small random f32 model of every GGUF architecture
// kiln writes (a row of src/models/architectures.def each: llama, qwen2,
// qwen3, phi3, gpt2) as GGUF files with a placeholder vocabulary, for
// tests/llamacpp/recipes_check.mjs --recipes none, which runs each in kiln and
// llama.cpp and compares their greedy ids. phi3 has partial rotary (24 of 32
// dims) and longrope (its long factors: the 256-position table and llama.cpp's
// context of 256 both exceed the original 64), qwen3 its q/k norms, qwen2 its
// biases, llama grouped-query attention.
//   kiln_arch_model OUT_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "placeholder_vocab.h"

namespace {

constexpr int64_t kVocab = 320;  // the placeholder vocabulary's 259 fixed tokens and more

kiln::models::ModelConfig llama_like(const std::string& type) {
  kiln::models::LlamaConfig c;
  c.model_type = type;
  c.vocab_size = kVocab;
  c.hidden_size = 128;
  c.intermediate_size = 256;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 32;
  c.max_position_embeddings = 256;
  c.qkv_bias = type == "qwen2";
  c.qk_norm = type == "qwen3";
  if (type == "phi3") {
    c.fused_projections = true;
    c.rotary_dim = 24;
    kiln::models::RopeScaling r;
    r.type = kiln::models::RopeScaling::Type::longrope;
    r.original_max_position_embeddings = 64;
    r.factor = 4.0;
    for (int i = 0; i < 12; ++i) {
      r.short_factor.push_back(1.0 + 0.05 * i);
      r.long_factor.push_back(1.0 + 1.5 * i);
    }
    c.rope_scaling = r;
  }
  kiln::models::ModelConfig cfg;
  cfg.model_type = type;
  cfg.llama = c;
  return cfg;
}

kiln::models::ModelConfig gpt2() {
  kiln::models::Gpt2Config g;
  g.vocab_size = kVocab;
  g.n_positions = 256;
  g.n_embd = 128;
  g.n_layer = 2;
  g.n_head = 4;
  kiln::models::ModelConfig cfg;
  cfg.model_type = "gpt2";
  cfg.gpt2 = g;
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_arch_model OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  uint64_t seed = 1;
  for (const char* type : {"llama", "qwen2", "qwen3", "phi3"})
    bench::save_random_model(llama_like(type), dir + "/" + type + ".gguf", seed++);
  bench::save_random_model(gpt2(), dir + "/gpt2.gguf", seed);
  std::printf("kiln_arch_model: wrote llama, qwen2, qwen3, phi3 and gpt2 .gguf in %s\n",
              dir.c_str());
  return 0;
}
