// kiln_recipe_model: writes the two small random f32 models that
// tests/llamacpp/recipes_check.mjs quantizes with every recipe and runs in
// kiln and llama.cpp, as GGUF files with a placeholder vocabulary:
//   k256.gguf  8 layers, 256 wide, 8 heads over 2 key-value heads, MLP 512,
//              untied: rows are whole blocks of 256, so the recipes' per-layer
//              choices (use_more_bits, Q2_K's grouped-query attn_v) apply;
//   w576.gguf  2 layers, SmolLM2-135M's widths (576, 9 heads over 3, MLP 1536),
//              tied: the 576-wide rows take the 32-value fallbacks.
// (Random weights as init() gives them: the tied one tends to repeat a token,
// but each step still compares whole next-token distributions.)
//   kiln_recipe_model OUT_DIR
#include <cstdio>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "placeholder_vocab.h"

namespace {

kiln::models::ModelConfig llama(int64_t layers, int64_t hidden, int64_t heads, int64_t kv,
                                int64_t ffn, bool tied) {
  kiln::models::LlamaConfig c;
  c.vocab_size = 320;  // the placeholder vocabulary's 259 fixed tokens and more
  c.hidden_size = hidden;
  c.intermediate_size = ffn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv;
  c.head_dim = hidden / heads;
  c.max_position_embeddings = 128;
  c.tie_word_embeddings = tied;
  kiln::models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: kiln_recipe_model OUT_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  bench::save_random_model(llama(8, 256, 8, 2, 512, false), dir + "/k256.gguf", 1);
  bench::save_random_model(llama(2, 576, 9, 3, 1536, true), dir + "/w576.gguf", 2);
  std::printf("kiln_recipe_model: wrote %s/k256.gguf and %s/w576.gguf\n", dir.c_str(), dir.c_str());
  return 0;
}
