// make_model with ModelOptions::weight_dtype q8_0 / q4_0 (random-init models):
// the token embedding is quantized with the Linear weights (and so is the head,
// tied to it or not), norms and biases stay f32; the logits, the generator's
// and perplexity's equal those of the f32 model holding the dequantized
// weights; save_gguf / load_gguf keep the embedding's blocks (GPT-2's tied
// output.weight too).
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "kiln/generate.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

models::ModelOptions with_dtype(DType q) {
  models::ModelOptions o;
  o.weight_dtype =
      q == q8_0 ? models::ModelOptions::WeightDType::q8_0 : models::ModelOptions::WeightDType::q4_0;
  o.max_seq_len = 64;
  return o;
}

models::ModelConfig tiny_llama(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 16;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

models::ModelConfig tiny_gpt2() {
  models::Gpt2Config c;
  c.vocab_size = 96;
  c.n_positions = 64;
  c.n_embd = 64;
  c.n_layer = 2;
  c.n_head = 4;
  models::ModelConfig cfg;
  cfg.model_type = "gpt2";
  cfg.gpt2 = c;
  return cfg;
}

// The f32 model with every weight of `q` (dequantized where quantized).
std::unique_ptr<models::CausalLM> dequantized_copy(Context& ctx, Backend& be,
                                                   const models::ModelConfig& cfg,
                                                   const models::CausalLM& q) {
  models::ModelOptions o;
  o.max_seq_len = 64;
  auto f = models::make_model(ctx, cfg, o);
  f->allocate(be);
  for (const auto& [name, p] : q.named_parameters()) f->parameter(name).set(p.get<float>());
  return f;
}

std::vector<float> embedding_logits_of(Context& ctx, models::CausalLM& m,
                                       const std::vector<int32_t>& ids) {
  Tensor x = ctx.input(i32, {1, int64_t(ids.size())}, "ids");
  m.eval();
  Tensor y = m(x);
  Graph g = Graph::forward(y);
  CpuBackend cpu(2);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  x.set(ids);
  cpu.compute(g);
  return y.get<float>();
}

std::vector<int32_t> prompt() { return {5, 17, 90, 3, 42, 42, 8, 61, 0, 77}; }

TEST(ModelQuantizedEmbedding, MakeModelQuantizesTheEmbeddingAndTheHead) {
  struct Arch {
    const char* name;
    models::ModelConfig cfg;
    const char* embed;
  };
  const Arch archs[] = {{"llama_tied", tiny_llama(true), "model.embed_tokens.weight"},
                        {"llama_untied", tiny_llama(false), "model.embed_tokens.weight"},
                        {"gpt2", tiny_gpt2(), "wte.weight"}};
  for (const Arch& a : archs)
    for (DType q : {q8_0, q4_0}) {
      const std::string what = std::string(a.name) + " " + dtype_name(q);
      Context ctx;
      CpuBackend cpu(2);
      auto m = models::make_model(ctx, a.cfg, with_dtype(q));
      const Tensor embed = m->parameter(a.embed), head = m->parameter("lm_head.weight");
      EXPECT_EQ(embed.dtype(), q) << what;
      EXPECT_EQ(head.dtype(), q) << what;
      EXPECT_EQ(embed.node() == head.node(), a.cfg.gpt2 || a.cfg.llama->tie_word_embeddings)
          << what;
      for (const auto& [name, p] : m->named_parameters()) {
        // 2-D weights are quantized (GPT-2's learned positions excepted); 1-D stay f32.
        const bool want = p.ndim() == 2 && name != "wpe.weight";
        EXPECT_EQ(p.dtype(), want ? q : f32) << what << " " << name;
        EXPECT_EQ(p.requires_grad(), !want) << what << " " << name;
      }
      m->allocate(cpu);
      m->init(3);
      Context c2;
      auto f = dequantized_copy(c2, cpu, a.cfg, *m);
      // More than 4 rows: the quantized matmul is exact to the dequantized
      // weights (qmatmul.h), and the embedding rows are the dequantized rows.
      const std::vector<float> lq = embedding_logits_of(ctx, *m, prompt()),
                               lf = embedding_logits_of(c2, *f, prompt());
      EXPECT_LT(rel_error(lq, lf), 1e-5) << what;
      // The quantization did change the model: init's f32 values differ.
      Context c3;
      models::ModelOptions o;
      o.max_seq_len = 64;
      auto orig = models::make_model(c3, a.cfg, o);
      orig->allocate(cpu);
      orig->init(3);
      EXPECT_GT(rel_error(embedding_logits_of(c3, *orig, prompt()), lf), 1e-4) << what;
    }
}

// Decoding reads the quantized embedding (one row per step) and the quantized
// head: the generator's logits follow the dequantized f32 model's. The head
// gets one row (the last token's), which AVX512_VNNI builds round to int8
// blocks (qmatmul.h; measured 0.007-0.010 here), so the logits get the
// tolerance of that rounding. Perplexity's windows (16 rows) are exact.
TEST(ModelQuantizedEmbedding, GeneratorAndPerplexityFollowTheDequantizedModel) {
  for (DType q : {q8_0, q4_0}) {
    const models::ModelConfig cfg = tiny_llama(true);
    Context ctx;
    CpuBackend cpu(2);
    auto m = models::make_model(ctx, cfg, with_dtype(q));
    m->allocate(cpu);
    m->init(5);
    Context c2;
    auto f = dequantized_copy(c2, cpu, cfg, *m);
    models::Generator gq(*m, cpu), gf(*f, cpu);
    auto span_of = [](const std::vector<int32_t>& v) { return std::span<const int32_t>(v); };
    const std::span<const float> pq = gq.prefill(span_of(prompt()));
    const std::vector<float> prefill_q(pq.begin(), pq.end());
    const std::span<const float> pf = gf.prefill(span_of(prompt()));
    EXPECT_LT(rel_error(prefill_q, std::vector<float>(pf.begin(), pf.end())), 2e-2)
        << dtype_name(q);
    for (int32_t id : {7, 93, 7, 0}) {
      const std::span<const float> sq = gq.step(id);
      const std::vector<float> step_q(sq.begin(), sq.end());
      const std::span<const float> sf = gf.step(id);
      EXPECT_LT(rel_error(step_q, std::vector<float>(sf.begin(), sf.end())), 2e-2)
          << dtype_name(q) << " step " << id;
    }
    models::GenerateOptions go;
    go.max_new_tokens = 6;
    go.sampling.temperature = 0;
    go.ignore_eos = true;
    EXPECT_EQ(gq.generate(prompt(), go).ids.size(), 6u);
    std::vector<int32_t> text;
    for (int i = 0; i < 40; ++i) text.push_back(int32_t((i * 37 + 11) % 96));
    const double ppl_q = models::perplexity(*m, cpu, text, 16).perplexity;
    const double ppl_f = models::perplexity(*f, cpu, text, 16).perplexity;
    EXPECT_NEAR(ppl_q / ppl_f, 1.0, 1e-4) << dtype_name(q);
  }
}

// kl_divergence of a Q4_0 model against an f32 base: the mean KL, top-1
// agreement and both perplexities equal those computed here from each model's
// logits of the same windows (16, 16 and 8 tokens); a model against itself is 0.
TEST(ModelQuantizedEmbedding, KlDivergenceAgainstABase) {
  const models::ModelConfig cfg = tiny_llama(false);
  Context ctx, c2;
  CpuBackend cpu(2);
  auto m = models::make_model(ctx, cfg, with_dtype(q4_0));
  m->allocate(cpu);
  m->init(5);
  models::ModelOptions o;
  o.max_seq_len = 64;
  auto base = models::make_model(c2, cfg, o);
  base->allocate(cpu);
  base->init(5);
  std::vector<int32_t> text;
  for (int i = 0; i < 40; ++i) text.push_back(int32_t((i * 37 + 11) % 96));
  const models::KlDivergenceResult r = models::kl_divergence(*m, *base, cpu, text, 16);
  double kl = 0, nll = 0, base_nll = 0;
  int64_t same = 0, n = 0;
  const int64_t V = 96;
  for (int64_t start = 0; start + 1 < 40; start += 16) {
    const std::vector<int32_t> w(text.begin() + start,
                                 text.begin() + std::min<int64_t>(40, start + 16));
    const std::vector<float> lm = embedding_logits_of(ctx, *m, w),
                             lb = embedding_logits_of(c2, *base, w);
    for (size_t t = 0; t + 1 < w.size(); ++t) {
      long double zm = 0, zb = 0;
      for (int64_t v = 0; v < V; ++v) {
        zm += std::exp((long double)lm[t * V + v]);
        zb += std::exp((long double)lb[t * V + v]);
      }
      int64_t am = 0, ab = 0;
      for (int64_t v = 0; v < V; ++v) {
        const long double pb = std::exp((long double)lb[t * V + v]) / zb;
        const long double pm = std::exp((long double)lm[t * V + v]) / zm;
        kl += double(pb * std::log(pb / pm));
        if (lm[t * V + v] > lm[t * V + am]) am = v;
        if (lb[t * V + v] > lb[t * V + ab]) ab = v;
      }
      same += am == ab;
      nll -= double(std::log(std::exp((long double)lm[t * V + w[t + 1]]) / zm));
      base_nll -= double(std::log(std::exp((long double)lb[t * V + w[t + 1]]) / zb));
      ++n;
    }
  }
  EXPECT_EQ(r.predicted, n);
  EXPECT_GT(r.mean_kl, 1e-4);  // Q4_0 moves the distributions
  EXPECT_NEAR(r.mean_kl, kl / double(n), 1e-6);
  EXPECT_DOUBLE_EQ(r.top1_agreement, double(same) / double(n));
  EXPECT_NEAR(r.perplexity, std::exp(nll / double(n)), 1e-6 * r.perplexity);
  EXPECT_NEAR(r.base_perplexity, std::exp(base_nll / double(n)), 1e-6 * r.base_perplexity);
  EXPECT_NEAR(r.base_perplexity, models::perplexity(*base, cpu, text, 16).perplexity,
              1e-4 * r.base_perplexity);
  const models::KlDivergenceResult self = models::kl_divergence(*base, *base, cpu, text, 16);
  EXPECT_NEAR(self.mean_kl, 0.0, 1e-12);
  EXPECT_EQ(self.top1_agreement, 1.0);
}

// save_gguf writes the quantized embedding as token_embd (GPT-2: output.weight
// too, the same blocks), load_gguf with weight_dtype stored keeps the blocks,
// and the reloaded model gives the same logits.
TEST(ModelQuantizedEmbedding, GgufKeepsTheEmbeddingsBlocks) {
  for (const models::ModelConfig& cfg : {tiny_llama(true), tiny_gpt2()})
    for (DType q : {q8_0, q4_0}) {
      kiln_test::TempDir tmp;
      Context ctx;
      CpuBackend cpu(2);
      auto m = models::make_model(ctx, cfg, with_dtype(q));
      m->allocate(cpu);
      m->init(7);
      const std::vector<float> want = embedding_logits_of(ctx, *m, prompt());
      models::save_gguf(*m, tmp.file("q.gguf"));
      GgufFile f(tmp.file("q.gguf"));
      const std::string embed = cfg.gpt2 ? "wte.weight" : "model.embed_tokens.weight";
      const std::vector<uint8_t> blocks = m->parameter(embed).get<uint8_t>();
      EXPECT_EQ(f.tensor_info("token_embd.weight").dtype, q);
      EXPECT_EQ(f.read_bytes("token_embd.weight"), blocks);
      if (cfg.gpt2) EXPECT_EQ(f.read_bytes("output.weight"), blocks);
      models::ModelOptions stored;
      stored.weight_dtype = models::ModelOptions::WeightDType::stored;
      Context c2;
      auto back = models::load_gguf(c2, cpu, tmp.file("q.gguf"), stored);
      EXPECT_EQ(back->parameter(embed).dtype(), q);
      EXPECT_EQ(back->parameter(embed).get<uint8_t>(), blocks);
      EXPECT_FALSE(back->parameter(embed).requires_grad());
      // GPT-2's Conv1D weights are written transposed, so dequantized: f32 now.
      EXPECT_LT(rel_error(embedding_logits_of(c2, *back, prompt()), want), 1e-5) << dtype_name(q);
    }
}

}  // namespace
}  // namespace kiln::test
