// Generation with the KV cache (kiln/generate.h) against the PyTorch reference
// (generation.safetensors of each fixture: greedy ids found by recomputing the
// whole sequence per token, and a perplexity), and against kiln's own
// full-sequence logits at every step.
#include <algorithm>
#include <cstring>
#include <map>
#include <numeric>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/ext/op_params.h"
#include "kiln/generate.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

const auto kGenerateFixtures =
    ::testing::Values("llama3_gqa", "llama_tied_bf16", "qwen2_bias", "qwen3_qknorm_f16",
                      "mistral_swa", "phi3_longrope", "gpt2");

struct LoadedFixture {
  Context ctx;
  CpuBackend cpu{1};
  std::unique_ptr<models::CausalLM> model;
  // precision: the context's matmul precision, set before the model is built.
  explicit LoadedFixture(const std::string& name, DType precision = f32)
      : model((ctx.set_matmul_precision(precision),
               models::load_pretrained(ctx, cpu, fixture_dir(name)))) {}
};

models::GenerateOptions greedy(int64_t n) {
  models::GenerateOptions o;
  o.max_new_tokens = n;
  o.sampling.temperature = 0;
  o.ignore_eos = true;
  return o;
}

// kiln's full-sequence logits [T, V] for ids (batch 1, no cache).
std::vector<float> full_logits(LoadedFixture& m, const std::vector<int32_t>& ids) {
  Tensor in = m.ctx.input(i32, {1, int64_t(ids.size())});
  Tensor logits = (*m.model)(in);
  Graph g = Graph::forward(logits);
  GraphAllocator galloc(m.cpu.buffer_type());
  galloc.alloc(g);
  in.set(ids);
  m.cpu.compute(g);
  return logits.get<float>();
}

std::vector<float> row(const std::vector<float>& all, size_t r, size_t V) {
  return {all.begin() + std::ptrdiff_t(r * V), all.begin() + std::ptrdiff_t((r + 1) * V)};
}

class GenerateFixture : public ::testing::TestWithParam<const char*> {};

TEST_P(GenerateFixture, GreedyIdsEqualTheReference) {
  LoadedFixture m(GetParam());
  Expected e(GetParam(), "generation.safetensors");
  models::Generator gen(*m.model, m.cpu);
  std::vector<int32_t> streamed;
  const std::vector<int32_t> prompt = e.ints("prompt_ids");
  models::GenerationResult r = gen.generate(prompt, greedy(12), [&](int32_t id) {
    streamed.push_back(id);
    return true;
  });
  EXPECT_EQ(r.ids, e.ints("greedy_ids"));
  EXPECT_EQ(streamed, r.ids);
  EXPECT_EQ(r.stop, models::StopReason::max_tokens);
  EXPECT_EQ(r.stats.prompt_tokens, int64_t(prompt.size()));
  EXPECT_EQ(r.stats.new_tokens, 12);
  EXPECT_EQ(r.stats.decode_steps, 11);
  EXPECT_EQ(gen.position(), int64_t(prompt.size()) + 11);
  // A second run starts again from an empty cache and gives the same ids.
  EXPECT_EQ(gen.generate(prompt, greedy(12)).ids, r.ids);
}

// The logits after every token, with prompts run in passes of several sizes (a
// padded pass of 7 in 8, passes of 4 and 2 over cached rows, then single
// tokens), equal the full-sequence logits of the same tokens.
TEST_P(GenerateFixture, CachedLogitsEqualFullSequenceLogits) {
  LoadedFixture m(GetParam());
  Expected e(GetParam(), "generation.safetensors");
  std::vector<int32_t> seq = e.ints("prompt_ids");
  for (int32_t id : e.ints("greedy_ids")) seq.push_back(id);
  const size_t V = size_t(m.model->vocab_size());
  const std::vector<float> full = full_logits(m, seq);
  models::GeneratorOptions go;
  go.prefill_chunk = 8;
  models::Generator gen(*m.model, m.cpu, go);
  double worst = 0;
  auto check = [&](size_t end) {  // feed seq[position(), end)
    const size_t at = size_t(gen.position());
    std::vector<float> got;
    std::span<const float> lg = gen.prefill(std::span<const int32_t>(seq.data() + at, end - at));
    got.assign(lg.begin(), lg.end());
    const double err = rel_error(got, row(full, end - 1, V));
    worst = std::max(worst, err);
    EXPECT_LT(err, 1e-4) << GetParam() << " after " << end << " tokens";
  };
  check(7);
  check(13);
  for (size_t end = 14; end <= seq.size(); ++end) check(end);
  EXPECT_EQ(gen.position(), int64_t(seq.size()));
  RecordProperty("worst_relative_error", std::to_string(worst));
}

TEST_P(GenerateFixture, PerplexityEqualsTheReference) {
  LoadedFixture m(GetParam());
  Expected e(GetParam(), "generation.safetensors");
  const std::vector<int32_t> ids = e.ints("ppl_ids");
  const int64_t window = e.ints("ppl_window")[0];
  models::PerplexityResult r = models::perplexity(*m.model, m.cpu, ids, window);
  const double want = e.floats("perplexity")[0];
  EXPECT_NEAR(r.perplexity / want, 1.0, 1e-4) << GetParam() << ": " << r.perplexity;
  EXPECT_EQ(r.windows, 3);  // 40 tokens in windows of 16: 16 + 16 + 8
  EXPECT_EQ(r.predicted, 15 + 15 + 7);
  EXPECT_NEAR(std::exp(r.mean_nll), r.perplexity, 1e-9 * r.perplexity);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GenerateFixture, kGenerateFixtures);

// A model read back from GGUF (llama.cpp's q/k row order undone on load)
// generates the reference's ids too, as does GPT-2's layout.
TEST(Generate, FromGguf) {
  for (const char* name : {"llama3_gqa", "gpt2"}) {
    kiln_test::TempDir tmp;
    {
      LoadedFixture m(name);
      models::save_gguf(*m.model, tmp.file("m.gguf"));
    }
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::load_gguf(ctx, cpu, tmp.file("m.gguf"));
    Expected e(name, "generation.safetensors");
    models::Generator gen(*model, cpu);
    EXPECT_EQ(gen.generate(e.ints("prompt_ids"), greedy(12)).ids, e.ints("greedy_ids")) << name;
  }
}

TEST(Generate, StopsAtEos) {
  LoadedFixture m("llama3_gqa");
  Expected e("llama3_gqa", "generation.safetensors");
  const std::vector<int32_t> want = e.ints("greedy_ids");
  const int32_t stop = want[3];  // its first occurrence is the fourth token
  ASSERT_EQ(std::find(want.begin(), want.end(), stop) - want.begin(), 3);
  models::Generator gen(*m.model, m.cpu);
  models::GenerateOptions o = greedy(12);
  o.ignore_eos = false;
  o.eos_token_ids = {stop};
  models::GenerationResult r = gen.generate(e.ints("prompt_ids"), o);
  EXPECT_EQ(r.ids, std::vector<int32_t>(want.begin(), want.begin() + 4));
  EXPECT_EQ(r.stop, models::StopReason::eos);
  // The model's own eos ids (generation_config.json: 2, 3) are the default.
  EXPECT_EQ(m.model->config().generation.eos_token_ids, (std::vector<int64_t>{2, 3}));
  o.eos_token_ids.clear();
  r = gen.generate(std::vector<int32_t>{5, 6, 7}, o);
  for (size_t i = 0; i + 1 < r.ids.size(); ++i) EXPECT_TRUE(r.ids[i] != 2 && r.ids[i] != 3);
  if (r.stop == models::StopReason::eos) EXPECT_TRUE(r.ids.back() == 2 || r.ids.back() == 3);
}

TEST(Generate, CallbackStopsAndContextFullStops) {
  LoadedFixture m("llama3_gqa");
  Expected e("llama3_gqa", "generation.safetensors");
  const std::vector<int32_t> want = e.ints("greedy_ids");
  models::Generator gen(*m.model, m.cpu);
  int calls = 0;
  models::GenerationResult r =
      gen.generate(e.ints("prompt_ids"), greedy(12), [&](int32_t) { return ++calls < 2; });
  EXPECT_EQ(r.stop, models::StopReason::callback);
  EXPECT_EQ(r.ids, std::vector<int32_t>(want.begin(), want.begin() + 2));
  // A cache of 8 positions: the 5-token prompt, then 3 steps; the 4th token is
  // sampled from the last logits and generation stops.
  models::GeneratorOptions go;
  go.max_seq_len = 8;
  models::Generator small(*m.model, m.cpu, go);
  r = small.generate(e.ints("prompt_ids"), greedy(12));
  EXPECT_EQ(r.stop, models::StopReason::context_full);
  EXPECT_EQ(r.ids, std::vector<int32_t>(want.begin(), want.begin() + 4));
}

TEST(Generate, Errors) {
  LoadedFixture m("gpt2");
  models::GeneratorOptions go;
  go.max_seq_len = 8;
  models::Generator gen(*m.model, m.cpu, go);
  EXPECT_KILN_ERROR(gen.prefill(std::vector<int32_t>(9, 1)), "generate", "9 new tokens",
                    "cache of 8 positions");
  EXPECT_KILN_ERROR(gen.prefill(std::vector<int32_t>{1, 96}), "generate", "token id 96", "index 1",
                    "vocabulary of 96");
  EXPECT_KILN_ERROR(gen.prefill(std::vector<int32_t>{-1}), "generate", "token id -1");
  EXPECT_KILN_ERROR(gen.prefill(std::vector<int32_t>{}), "generate", "empty prompt");
  EXPECT_EQ(gen.position(), 0);  // nothing was run
  go.max_seq_len = 17;
  EXPECT_KILN_ERROR(models::Generator(*m.model, m.cpu, go), "generate", "max_seq_len 17",
                    "16 positions");
  models::SamplingConfig sc;
  sc.top_p = 0;
  EXPECT_KILN_ERROR(models::Sampler{sc}, "sample", "top_p");
  sc = {};
  sc.temperature = -1;
  EXPECT_KILN_ERROR(models::Sampler{sc}, "sample", "temperature");
  EXPECT_KILN_ERROR(models::perplexity(*m.model, m.cpu, std::vector<int32_t>{1, 2}, 17),
                    "perplexity", "window of 17");
  EXPECT_KILN_ERROR(models::perplexity(*m.model, m.cpu, std::vector<int32_t>{1}, 8), "perplexity",
                    "at least 2 tokens");
}

// GeneratorOptions::passes: the bias fusion on models with biases gives the
// same logits bit for bit, and the fused products are in the context; the
// default runs no pass; a training-only pass is an error naming it.
TEST(Generate, GraphPasses) {
  auto biased_products = [](Context& ctx) {
    int n = 0;
    for (size_t i = 0; i < ctx.size(); ++i)
      n += ctx.node(i)->op == Op::MATMUL && ctx.node(i)->n_src == 3;
    return n;
  };
  for (const char* name : {"gpt2", "qwen2_bias"}) {
    SCOPED_TRACE(name);
    LoadedFixture plain(name), fused(name);
    Expected e(name, "generation.safetensors");
    models::GeneratorOptions go;
    go.passes = {GraphPass::fuse_bias};
    models::Generator g0(*plain.model, plain.cpu), g1(*fused.model, fused.cpu, go);
    EXPECT_TRUE(g0.graph_passes().empty());
    EXPECT_EQ(g1.graph_passes(), go.passes);
    const std::vector<int32_t> prompt = e.ints("prompt_ids");
    for (int32_t next : {-1, 3, 5}) {  // the prompt, then two steps
      std::vector<float> l0, l1;
      if (next < 0) {
        const auto a = g0.prefill(prompt), b = g1.prefill(prompt);
        l0.assign(a.begin(), a.end());
        l1.assign(b.begin(), b.end());
      } else {
        const auto a = g0.step(next), b = g1.step(next);
        l0.assign(a.begin(), a.end());
        l1.assign(b.begin(), b.end());
      }
      ASSERT_EQ(l0.size(), l1.size());
      EXPECT_EQ(std::memcmp(l0.data(), l1.data(), l0.size() * sizeof(float)), 0) << next;
    }
    EXPECT_EQ(biased_products(plain.ctx), 0);
    EXPECT_GT(biased_products(fused.ctx), 0);
  }
  LoadedFixture m("gpt2");
  models::GeneratorOptions go;
  go.passes = {GraphPass::fuse_bias, GraphPass::fuse_residual};
  EXPECT_KILN_ERROR(models::Generator(*m.model, m.cpu, go), "generate", "graph pass fuse_residual",
                    "not valid for inference graphs");
  go.passes = {GraphPass::fold_casts};
  EXPECT_KILN_ERROR(models::Generator(*m.model, m.cpu, go), "generate",
                    "graph pass fold_casts needs fuse_casts");
}

// The inference passes on models under the bf16 policy (as kiln-lm generate
// --precision bf16 builds them): fuse_bias, fuse_casts and fold_casts give the
// logits of the graphs without passes bit for bit (the products round the same
// operands, the norms and products store what their casts stored); with
// bf16_gelu_inputs too (GPT-2's MLP) GELU reads its input rounded to bf16, so
// the logits move by about that rounding (2^-9 relative) and stay within 1e-2.
TEST(Generate, InferencePassesUnderTheBf16Policy) {
  auto count = [](Context& ctx, auto pred) {
    int n = 0;
    for (size_t i = 0; i < ctx.size(); ++i) n += pred(*ctx.node(i));
    return n;
  };
  auto biased = [](const TensorNode& t) { return t.op == Op::MATMUL && t.n_src == 3; };
  auto rounding = [](const TensorNode& t) {
    return (t.op == Op::MATMUL || t.op == Op::MATMUL_ACC) &&
           op_params<MatmulParams>(t).round_bf16 != 0;
  };
  auto bf16_norm = [](const TensorNode& t) { return t.op == Op::LAYER_NORM && t.dtype == bf16; };
  auto bf16_gelu = [](const TensorNode& t) {
    return (t.op == Op::GELU || t.op == Op::GELU_ERF) && t.src[0]->dtype == bf16;
  };
  const GraphPasses all = GraphPasses::defaults(GraphKind::inference);
  const GraphPasses exact = all.without(GraphPass::bf16_gelu_inputs);
  for (const char* name : {"gpt2", "qwen2_bias", "llama3_gqa"}) {
    SCOPED_TRACE(name);
    LoadedFixture m[3] = {LoadedFixture(name, bf16), LoadedFixture(name, bf16),
                          LoadedFixture(name, bf16)};
    const GraphPasses passes[3] = {GraphPasses(), exact, all};
    std::vector<std::unique_ptr<models::Generator>> gen;
    for (int i = 0; i < 3; ++i) {
      models::GeneratorOptions go;
      go.passes = passes[i];
      gen.push_back(std::make_unique<models::Generator>(*m[i].model, m[i].cpu, go));
      EXPECT_EQ(gen.back()->graph_passes(), passes[i]);
    }
    const std::vector<int32_t> prompt = Expected(name, "generation.safetensors").ints("prompt_ids");
    for (int32_t next : {-1, 3, 5}) {  // the prompt, then two steps
      std::vector<float> l[3];
      for (int i = 0; i < 3; ++i) {
        const std::span<const float> s =
            next < 0 ? gen[size_t(i)]->prefill(prompt) : gen[size_t(i)]->step(next);
        l[i].assign(s.begin(), s.end());
      }
      ASSERT_EQ(l[0].size(), l[1].size());
      EXPECT_EQ(std::memcmp(l[0].data(), l[1].data(), l[0].size() * sizeof(float)), 0) << next;
      EXPECT_LT(rel_error(l[2], l[0]), 1e-2) << next;
    }
    const bool gpt2 = std::string(name) == "gpt2", has_bias = std::string(name) != "llama3_gqa";
    EXPECT_EQ(count(m[0].ctx, rounding), 0);
    EXPECT_GT(count(m[1].ctx, rounding), 0);  // the f32 weights, rounded as they are packed
    EXPECT_EQ(count(m[0].ctx, biased), 0);
    EXPECT_EQ(count(m[1].ctx, biased) > 0, has_bias);
    EXPECT_EQ(count(m[0].ctx, bf16_norm), 0);
    EXPECT_EQ(count(m[1].ctx, bf16_norm) > 0, gpt2);  // the Llamas' RMSNorm stores f32 only
    EXPECT_EQ(count(m[1].ctx, bf16_gelu), 0);
    EXPECT_EQ(count(m[2].ctx, bf16_gelu) > 0, gpt2);
  }
}

// Decoding reuses one graph per (tokens, cache bucket): steps inside a bucket
// add no tensors to the context.
TEST(Generate, StepsReuseTheirGraph) {
  LoadedFixture m("llama3_gqa");
  models::Generator gen(*m.model, m.cpu);
  gen.prefill(std::vector<int32_t>{1, 2, 3});
  gen.step(4);  // position 3: the 16-row bucket
  const size_t nodes = m.ctx.size(), graphs = gen.graphs();
  for (int32_t t = 5; t < 15; ++t) gen.step(t);
  EXPECT_EQ(m.ctx.size(), nodes);
  EXPECT_EQ(gen.graphs(), graphs);
  gen.step(15);  // positions 14, 15, 16: still the 16-row bucket
  gen.step(16);
  gen.step(17);
  EXPECT_EQ(gen.graphs(), graphs);
  gen.step(18);  // position 17: 32 rows
  EXPECT_EQ(gen.graphs(), graphs + 1);
}

// reuse_cache: a second turn (the first turn's prompt and reply, then new
// text) runs only the tokens the cache lacks and gives what a fresh run gives;
// a prompt that leaves the cached tokens midway keeps their common prefix.
TEST_P(GenerateFixture, ReusedCacheRunsOnlyNewTokens) {
  LoadedFixture m(GetParam());
  models::Generator gen(*m.model, m.cpu), fresh(*m.model, m.cpu);
  models::GenerateOptions o = greedy(6);
  o.reuse_cache = true;
  const std::vector<int32_t> turn1{3, 4, 5, 6, 7};
  const models::GenerationResult r1 = gen.generate(turn1, o);
  EXPECT_EQ(r1.stats.reused_tokens, 0);
  ASSERT_EQ(r1.ids.size(), 6u);
  // The cache holds the prompt and the reply but its last token (never run).
  std::vector<int32_t> held = turn1;
  held.insert(held.end(), r1.ids.begin(), r1.ids.end() - 1);
  EXPECT_EQ(std::vector<int32_t>(gen.cached_tokens().begin(), gen.cached_tokens().end()), held);
  std::vector<int32_t> turn2 = turn1;
  turn2.insert(turn2.end(), r1.ids.begin(), r1.ids.end());
  for (int32_t id : {8, 9, 10}) turn2.push_back(id);
  const models::GenerationResult r2 = gen.generate(turn2, o);
  EXPECT_EQ(r2.stats.reused_tokens, int64_t(held.size()));
  EXPECT_EQ(r2.stats.prompt_tokens, int64_t(turn2.size() - held.size()));
  EXPECT_EQ(r2.ids, fresh.generate(turn2, greedy(6)).ids);
  // Diverging at index 2: only {3, 4} is kept.
  const std::vector<int32_t> other{3, 4, 11, 12};
  const models::GenerationResult r3 = gen.generate(other, o);
  EXPECT_EQ(r3.stats.reused_tokens, 2);
  EXPECT_EQ(r3.ids, fresh.generate(other, greedy(6)).ids);
  // The same prompt again: all but its last token reused.
  EXPECT_EQ(gen.generate(other, o).stats.reused_tokens, int64_t(other.size() - 1));
  EXPECT_KILN_ERROR(gen.truncate(gen.position() + 1), "generate", "truncate");
}

// prefill_uncached: after a reply the chat runs the end of the turn ahead; the
// next turn then runs only its new text, and replies as a fresh run does.
TEST_P(GenerateFixture, PrefillUncachedRunsTheEndOfATurnAhead) {
  LoadedFixture m(GetParam());
  models::Generator gen(*m.model, m.cpu), fresh(*m.model, m.cpu);
  models::GenerateOptions o = greedy(4);
  o.reuse_cache = true;
  const std::vector<int32_t> turn1{3, 4, 5, 6};
  const models::GenerationResult r1 = gen.generate(turn1, o);
  std::vector<int32_t> history = turn1;  // the reply, then an end of turn {1, 2}
  history.insert(history.end(), r1.ids.begin(), r1.ids.end());
  for (int32_t id : {1, 2}) history.push_back(id);
  EXPECT_EQ(gen.prefill_uncached(history), 3);  // the reply's last token and the end
  EXPECT_EQ(gen.position(), int64_t(history.size()));
  EXPECT_EQ(gen.prefill_uncached(history), 0);
  std::vector<int32_t> turn2 = history;
  for (int32_t id : {8, 9, 10}) turn2.push_back(id);
  const models::GenerationResult r2 = gen.generate(turn2, o);
  EXPECT_EQ(r2.stats.prompt_tokens, 3);
  EXPECT_EQ(r2.stats.reused_tokens, int64_t(history.size()));
  EXPECT_EQ(r2.ids, fresh.generate(turn2, greedy(4)).ids);
  // A shorter or diverging list keeps the common prefix only.
  EXPECT_EQ(gen.prefill_uncached(std::vector<int32_t>{3, 4, 7}), 1);
  EXPECT_EQ(std::vector<int32_t>(gen.cached_tokens().begin(), gen.cached_tokens().end()),
            (std::vector<int32_t>{3, 4, 7}));
  EXPECT_EQ(gen.prefill_uncached(std::vector<int32_t>{}), 0);
  EXPECT_EQ(gen.position(), 0);
}

// Sampling: reproducible per seed, top-k and top-p keep what they say, and the
// draws follow the softmax.
TEST(Sampling, SeedsReproduce) {
  LoadedFixture m("qwen3_qknorm_f16");
  models::Generator gen(*m.model, m.cpu);
  models::GenerateOptions o;
  o.max_new_tokens = 16;
  o.ignore_eos = true;
  o.sampling.seed = 7;
  const std::vector<int32_t> prompt{3, 4, 5};
  const std::vector<int32_t> a = gen.generate(prompt, o).ids, b = gen.generate(prompt, o).ids;
  EXPECT_EQ(a, b);
  o.sampling.seed = 8;
  EXPECT_NE(gen.generate(prompt, o).ids, a);
  o.sampling.top_k = 1;  // top-1 is greedy, whatever the seed and temperature
  o.sampling.temperature = 5;
  models::GenerateOptions g = greedy(16);
  EXPECT_EQ(gen.generate(prompt, o).ids, gen.generate(prompt, g).ids);
}

TEST(Sampling, TopKAndTopP) {
  const std::vector<float> logits{1.0f, 3.0f, 2.0f, 3.0f, -1.0f, 0.5f};
  models::SamplingConfig c;
  c.top_k = 3;
  auto k = models::Sampler(c).candidates(logits);
  ASSERT_EQ(k.size(), 3u);  // 3.0 (id 1), 3.0 (id 3), 2.0 (id 2)
  EXPECT_EQ(k[0].first, 1);
  EXPECT_EQ(k[1].first, 3);
  EXPECT_EQ(k[2].first, 2);
  const double z = 2 * std::exp(3.0) + std::exp(2.0);
  EXPECT_NEAR(k[2].second, std::exp(2.0) / z, 1e-12);
  // Softmax of all six: p(3.0) = 0.3842 each, p(2.0) = 0.1413; top-p 0.77 needs
  // both 3.0s (0.7684 < 0.77) and the 2.0; 0.76, the two 3.0s alone.
  c = {};
  c.top_p = 0.77f;
  auto p = models::Sampler(c).candidates(logits);
  ASSERT_EQ(p.size(), 3u);
  EXPECT_EQ(p[2].first, 2);
  c.top_p = 0.76f;
  EXPECT_EQ(models::Sampler(c).candidates(logits).size(), 2u);
  c.temperature = 0;
  auto g = models::Sampler(c).candidates(logits);
  ASSERT_EQ(g.size(), 1u);
  EXPECT_EQ(g[0].first, 1);  // the first largest
  // Draws with top-k 3 never leave the three, and follow their probabilities.
  c = {};
  c.top_k = 3;
  c.seed = 1;
  models::Sampler s(c);
  std::map<int32_t, int> count;
  const int n = 20000;
  for (int i = 0; i < n; ++i) ++count[s.sample(logits)];
  EXPECT_EQ(count.size(), 3u);
  for (const auto& [id, prob] : k) EXPECT_NEAR(double(count[id]) / n, prob, 0.015) << id;
}

}  // namespace
}  // namespace kiln::test
