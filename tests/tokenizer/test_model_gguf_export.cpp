// models::save_gguf with a tokenizer: the file holds llama.cpp's tokenizer.ggml.*
// keys next to the weights, Tokenizer::from_gguf rebuilds a tokenizer with the
// same ids from it, and load_gguf gives the same logits (Llama with Llama-2's
// SentencePiece vocabulary, GPT-2 with its byte-level one).
#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln_test::tokenizer_dir;
namespace models = kiln::models;

models::ModelConfig tiny_llama(int64_t vocab) {
  models::LlamaConfig c;
  c.vocab_size = vocab;
  c.hidden_size = 8;
  c.intermediate_size = 16;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 16;
  c.tie_word_embeddings = true;
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  cfg.generation.bos_token_id = 1;
  cfg.generation.eos_token_ids = {2};
  return cfg;
}

models::ModelConfig tiny_gpt2(int64_t vocab) {
  models::Gpt2Config g;
  g.vocab_size = vocab;
  g.n_positions = 16;
  g.n_embd = 8;
  g.n_layer = 1;
  g.n_head = 2;
  g.resid_pdrop = g.embd_pdrop = g.attn_pdrop = 0.0f;
  models::ModelConfig cfg;
  cfg.model_type = "gpt2";
  cfg.gpt2 = g;
  cfg.generation.bos_token_id = 50256;
  cfg.generation.eos_token_ids = {50256};
  return cfg;
}

std::vector<float> logits(models::CausalLM& m, kiln::CpuBackend& cpu,
                          const std::vector<int32_t>& ids) {
  m.eval();
  kiln::Tensor x = m.ctx().input(kiln::i32, {1, int64_t(ids.size())}, "ids");
  kiln::Tensor out = m(x);
  kiln::Graph g = kiln::Graph::forward(out);
  kiln::GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  x.set(ids);
  cpu.compute(g);
  return out.get<float>();
}

// Writes `cfg`'s random model with the tokenizer of `name`, then reads both back.
void round_trip(const std::string& name, const models::ModelConfig& cfg, const char* kind) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(name));
  kiln::Context ctx;
  kiln::CpuBackend cpu(1);
  auto model = models::make_model(ctx, cfg);
  model->allocate(cpu);
  model->init(7);
  kiln_test::TempDir dir;
  const std::string path = dir.file("model.gguf");
  models::save_gguf(*model, path, &tok);

  kiln::GgufFile f(path);
  EXPECT_EQ(f.get("tokenizer.ggml.model").as_string(), kind);
  EXPECT_EQ(int64_t(f.get("tokenizer.ggml.tokens").as_strings().size()), tok.vocab_size());
  EXPECT_EQ(int64_t(f.get("tokenizer.ggml.token_type").as_ints().size()), tok.vocab_size());
  EXPECT_FALSE(f.get("tokenizer.ggml.merges").as_strings().empty());
  if (std::string(kind) == "llama") {
    EXPECT_EQ(int64_t(f.get("tokenizer.ggml.scores").as_floats().size()), tok.vocab_size());
    EXPECT_TRUE(f.get("tokenizer.ggml.add_bos_token").as_bool());
  } else {
    EXPECT_EQ(f.get("tokenizer.ggml.pre").as_string(), "gpt-2");
  }
  EXPECT_EQ(f.get("tokenizer.ggml.bos_token_id").as_int(), cfg.generation.bos_token_id);
  EXPECT_EQ(f.get("tokenizer.ggml.eos_token_id").as_int(), cfg.generation.eos_token_ids[0]);
  EXPECT_EQ(f.get("general.architecture").as_string(), cfg.gpt2 ? "gpt2" : "llama");

  // The vocabulary gives the tokenizer back...
  kiln::Tokenizer back = kiln::Tokenizer::from_gguf(f);
  EXPECT_EQ(back.vocab_size(), tok.vocab_size());
  for (const char* file : {"english.txt", "scripts.txt", "code.py.txt"}) {
    const std::string t = kiln_test::text(file);
    EXPECT_EQ(back.encode(t, true), tok.encode(t, true)) << name << " " << file;
  }
  // ...and the weights the model.
  kiln::Context ctx2;
  auto loaded = models::load_gguf(ctx2, cpu, path);
  const std::vector<int32_t> ids = tok.encode("Fellow citizens of the Senate", true);
  EXPECT_EQ(logits(*loaded, cpu, ids), logits(*model, cpu, ids));
  EXPECT_EQ(loaded->config().generation.bos_token_id, cfg.generation.bos_token_id);
}

TEST(ModelGgufTokenizer, LlamaWithLlama2Vocabulary) {
  round_trip("llama2", tiny_llama(32000), "llama");
}

TEST(ModelGgufTokenizer, Gpt2WithItsVocabulary) { round_trip("gpt2", tiny_gpt2(50257), "gpt2"); }

TEST(ModelGgufTokenizer, GenerationIdsOverrideTheTokenizers) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir("llama2"));
  models::ModelConfig cfg = tiny_llama(32000);
  cfg.generation.eos_token_ids = {13};  // e.g. a model fine-tuned to stop at a newline
  kiln::Context ctx;
  kiln::CpuBackend cpu(1);
  auto model = models::make_model(ctx, cfg);
  model->allocate(cpu);
  kiln_test::TempDir dir;
  models::save_gguf(*model, dir.file("m.gguf"), &tok);
  kiln::GgufFile f(dir.file("m.gguf"));
  EXPECT_EQ(f.get("tokenizer.ggml.eos_token_id").as_int(), 13);
  EXPECT_EQ(f.get("tokenizer.ggml.bos_token_id").as_int(), 1);
}

TEST(ModelGgufTokenizer, VocabularySizeMustMatch) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir("llama2"));
  kiln::Context ctx;
  kiln::CpuBackend cpu(1);
  auto model = models::make_model(ctx, tiny_llama(96));
  model->allocate(cpu);
  kiln_test::TempDir dir;
  EXPECT_KILN_ERROR(models::save_gguf(*model, dir.file("m.gguf"), &tok), "models",
                    "the tokenizer has 32000 tokens but the model's vocab_size is 96");
  EXPECT_FALSE(std::filesystem::exists(dir.file("m.gguf")));
}

}  // namespace
