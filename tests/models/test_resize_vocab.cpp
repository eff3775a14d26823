// kiln::models::resize_token_embeddings (kiln-lm add-tokens): the old rows of
// the embedding and of an untied head are kept, new rows are the mean of the
// old ones, every other param is copied, and the resized model's logits for
// the old tokens are the model's.
#include <cmath>

#include "common/error_check.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

models::ModelConfig resize_test_llama(bool tied) {
  models::LlamaConfig c;
  c.vocab_size = 61;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 8;
  c.max_position_embeddings = 64;
  c.tie_word_embeddings = tied;
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

// Logits [1, 5, vocab] of ids 0..4 spread over the old vocabulary.
std::vector<float> resize_test_logits(Context& ctx, models::CausalLM& model) {
  Tensor ids = ctx.input(i32, {1, 5}, "ids");
  model.eval();
  Tensor logits = model(ids);
  Graph g = Graph::forward(logits);
  CpuBackend cpu(1);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  ids.set(std::vector<int32_t>{0, 7, 60, 13, 42});
  cpu.compute(g);
  return logits.get<float>();
}

void check_resized(bool tied) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::make_model(ctx, resize_test_llama(tied));
  model->allocate(cpu);
  model->init(3);
  Context ctx2;
  auto grown = models::resize_token_embeddings(ctx2, cpu, *model, 64);
  EXPECT_EQ(grown->vocab_size(), 64);
  EXPECT_EQ(grown->config().llama->vocab_size, 64);
  EXPECT_EQ(grown->config().llama->tie_word_embeddings, tied);
  const auto before = model->named_base_parameters();
  const auto after = grown->named_base_parameters();
  ASSERT_EQ(before.size(), after.size());
  int resized = 0;
  for (size_t k = 0; k < before.size(); ++k) {
    ASSERT_EQ(before[k].first, after[k].first);
    const std::vector<float> a = before[k].second.get<float>(), b = after[k].second.get<float>();
    if (before[k].second.shape() == after[k].second.shape()) {
      EXPECT_EQ(a, b) << before[k].first;
      continue;
    }
    ++resized;
    const int64_t w = 32;
    ASSERT_EQ(after[k].second.shape(), Shape({64, w})) << after[k].first;
    for (int64_t c = 0; c < w; ++c) {
      double mean = 0;
      for (int64_t r = 0; r < 61; ++r) {
        EXPECT_EQ(b[size_t(r * w + c)], a[size_t(r * w + c)]);
        mean += a[size_t(r * w + c)];
      }
      mean /= 61;
      for (int64_t r = 61; r < 64; ++r) EXPECT_NEAR(b[size_t(r * w + c)], mean, 1e-6);
    }
  }
  EXPECT_EQ(resized, tied ? 1 : 2);  // the embedding, and an untied head

  // The old tokens' logits are the model's; the new tokens' are equal (same rows).
  const std::vector<float> old_logits = resize_test_logits(ctx, *model);
  const std::vector<float> new_logits = resize_test_logits(ctx2, *grown);
  ASSERT_EQ(new_logits.size(), size_t(5 * 64));
  for (int64_t t = 0; t < 5; ++t) {
    for (int64_t v = 0; v < 61; ++v)
      EXPECT_NEAR(new_logits[size_t(t * 64 + v)], old_logits[size_t(t * 61 + v)], 1e-4);
    EXPECT_NEAR(new_logits[size_t(t * 64 + 61)], new_logits[size_t(t * 64 + 63)], 1e-5);
  }

  // Smaller: the first rows.
  Context ctx3;
  auto shrunk = models::resize_token_embeddings(ctx3, cpu, *model, 50);
  const std::vector<float> e0 = model->parameter("model.embed_tokens.weight").get<float>();
  const std::vector<float> e1 = shrunk->parameter("model.embed_tokens.weight").get<float>();
  EXPECT_EQ(e1, std::vector<float>(e0.begin(), e0.begin() + 50 * 32));
}

TEST(ResizeTokenEmbeddings, TiedKeepsOldRowsAndAddsTheMean) { check_resized(true); }
TEST(ResizeTokenEmbeddings, UntiedResizesTheHeadToo) { check_resized(false); }

TEST(ResizeTokenEmbeddings, RefusesAnEmptyVocabulary) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::make_model(ctx, resize_test_llama(true));
  model->allocate(cpu);
  Context ctx2;
  EXPECT_KILN_ERROR(models::resize_token_embeddings(ctx2, cpu, *model, 0), "models",
                    "vocab_size 0");
}

}  // namespace
}  // namespace kiln::test
