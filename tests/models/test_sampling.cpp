// Sampling (kiln/sampling.h): each step against a reference implementation of
// its definition on fixed logits (written here in double, every token sorted,
// nothing skipped), the penalties' history window, stop strings, and the
// defaults generation_config.json gives.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>

#include "common/error_check.h"
#include "kiln/generate.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

using models::SamplingConfig;

// The definitions, one after the other (kiln/sampling.h's order): returns the
// kept ids and their probabilities, most likely first (ties: lower id first).
std::vector<std::pair<int32_t, double>> reference(const std::vector<float>& logits,
                                                  const SamplingConfig& c,
                                                  const std::vector<int32_t>& prompt,
                                                  const std::vector<int32_t>& generated) {
  std::vector<double> l(logits.begin(), logits.end());
  for (const auto& [id, b] : c.logit_bias) l[size_t(id)] += b;
  std::vector<std::pair<int32_t, bool>> hist;
  for (int32_t id : prompt) hist.emplace_back(id, false);
  for (int32_t id : generated) hist.emplace_back(id, true);
  if (c.penalty_last_n > 0 && hist.size() > size_t(c.penalty_last_n))
    hist.erase(hist.begin(), hist.end() - c.penalty_last_n);
  std::set<int32_t> seen;
  std::map<int32_t, int> gen_count;
  for (const auto& [id, g] : hist) {
    seen.insert(id);
    if (g) ++gen_count[id];
  }
  for (int32_t id : seen) {
    double& x = l[size_t(id)];
    x = x > 0 ? x / c.repetition_penalty : x * c.repetition_penalty;
  }
  for (const auto& [id, n] : gen_count)
    l[size_t(id)] -= c.presence_penalty + c.frequency_penalty * n;
  std::vector<int32_t> ids(l.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  if (c.temperature == 0) return {{ids[0], 1.0}};
  std::vector<std::pair<int32_t, double>> p;
  for (int32_t id : ids) p.emplace_back(id, std::exp((l[size_t(id)] - l[ids[0]]) / c.temperature));
  auto normalize = [&] {
    double s = 0;
    for (auto& e : p) s += e.second;
    for (auto& e : p) e.second /= s;
  };
  std::erase_if(p, [](auto& e) { return e.second == 0; });
  normalize();
  if (c.top_k > 0 && size_t(c.top_k) < p.size()) p.resize(size_t(c.top_k));
  normalize();
  double cum = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if ((cum += p[i].second) >= c.top_p) {
      p.resize(i + 1);
      break;
    }
  normalize();
  const double floor_p = c.min_p * p[0].second;
  std::erase_if(p, [&](auto& e) { return e.second < floor_p; });
  normalize();
  return p;
}

void expect_same(const std::vector<std::pair<int32_t, double>>& got,
                 const std::vector<std::pair<int32_t, double>>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first) << i;
    EXPECT_NEAR(got[i].second, want[i].second, 1e-6 * want[i].second + 1e-12) << i;
  }
}

std::vector<float> fixed_logits(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, 2.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

TEST(Sampling, EveryStepFollowsItsDefinition) {
  const std::vector<float> logits = fixed_logits(300, 11);
  const std::vector<int32_t> prompt{5, 7, 7, 250, 9, 12};
  const std::vector<int32_t> generated{7, 30, 30, 30, 41, 5, 199};
  std::vector<SamplingConfig> configs;
  auto add = [&](auto set) {
    SamplingConfig c;
    set(c);
    configs.push_back(c);
  };
  add([](SamplingConfig& c) { c.temperature = 0.7f; });
  add([](SamplingConfig& c) { c.top_k = 20; });
  add([](SamplingConfig& c) { c.top_p = 0.6f; });
  add([](SamplingConfig& c) { c.min_p = 0.05f; });
  add([](SamplingConfig& c) {
    c.temperature = 1.3f;
    c.top_k = 50;
    c.top_p = 0.9f;
    c.min_p = 0.02f;
  });
  add([](SamplingConfig& c) { c.repetition_penalty = 1.3f; });
  add([](SamplingConfig& c) { c.presence_penalty = 0.8f; });
  add([](SamplingConfig& c) { c.frequency_penalty = 0.5f; });
  add([](SamplingConfig& c) {
    c.repetition_penalty = 1.2f;
    c.presence_penalty = -0.5f;  // negative: encourages repeats
    c.frequency_penalty = 0.25f;
    c.penalty_last_n = 6;  // the last 6 of the 13 history tokens
    c.top_p = 0.8f;
  });
  add([](SamplingConfig& c) {
    c.logit_bias = {{3, 5.0f}, {17, -INFINITY}, {42, -2.5f}};
    c.min_p = 0.1f;
  });
  add([](SamplingConfig& c) {
    c.temperature = 0;  // greedy on the adjusted logits
    c.repetition_penalty = 3.0f;
    c.logit_bias = {{0, 1.0f}};
  });
  for (size_t i = 0; i < configs.size(); ++i) {
    SCOPED_TRACE("config " + std::to_string(i));
    models::Sampler s(configs[i]);
    s.set_prompt(prompt);
    for (int32_t id : generated) s.accept(id);
    expect_same(s.candidates(logits), reference(logits, configs[i], prompt, generated));
  }
}

// min-p is relative to the most likely token: with logits 0, -1, -2, -3 the
// probabilities relative to the first are e^0, e^-1, e^-2, e^-3.
TEST(Sampling, MinPKeepsTokensRelativeToTheMostLikely) {
  const std::vector<float> logits{0.0f, -1.0f, -2.0f, -3.0f};
  SamplingConfig c;
  c.min_p = float(std::exp(-2.0)) * 0.999f;
  EXPECT_EQ(models::Sampler(c).candidates(logits).size(), 3u);
  c.min_p = float(std::exp(-2.0)) * 1.001f;
  EXPECT_EQ(models::Sampler(c).candidates(logits).size(), 2u);
  c.min_p = 1.0f;  // only the most likely
  EXPECT_EQ(models::Sampler(c).candidates(logits).size(), 1u);
}

// The repetition penalty divides positive logits and multiplies negative ones.
TEST(Sampling, RepetitionPenaltyByTheSignOfTheLogit) {
  const std::vector<float> logits{2.0f, -2.0f, 1.0f};
  SamplingConfig c;
  c.temperature = 1;
  c.repetition_penalty = 2.0f;
  models::Sampler s(c);
  const std::vector<int32_t> prompt{0, 1};
  s.set_prompt(prompt);
  // Adjusted: 1, -4, 1 -> p(0) = p(2) = 1 / (2 + e^-5).
  auto k = s.candidates(logits);
  ASSERT_EQ(k.size(), 3u);
  const double z = 2 + std::exp(-5.0);
  EXPECT_EQ(k[0].first, 0);
  EXPECT_EQ(k[1].first, 2);
  EXPECT_NEAR(k[0].second, 1 / z, 1e-12);
  EXPECT_NEAR(k[2].second, std::exp(-5.0) / z, 1e-12);
}

// The window holds the last penalty_last_n tokens; presence and frequency
// count only generated ones (a prompt token is not penalised by them).
TEST(Sampling, PenaltyWindowAndWhatEachPenaltyCounts) {
  const std::vector<float> logits(4, 0.0f);
  SamplingConfig c;
  c.temperature = 1;
  c.presence_penalty = 1.0f;
  c.penalty_last_n = 2;
  models::Sampler s(c);
  const std::vector<int32_t> prompt{3};
  s.set_prompt(prompt);
  auto p = [&](int32_t id) {
    for (auto& [i, q] : s.candidates(logits))
      if (i == id) return q;
    return 0.0;
  };
  EXPECT_NEAR(p(3), 0.25, 1e-12);  // a prompt token: no presence penalty
  s.accept(0);
  s.accept(1);  // window: 0, 1
  EXPECT_LT(p(0), 0.25);
  EXPECT_LT(p(1), 0.25);
  s.accept(2);  // window: 1, 2; token 0 has left it
  EXPECT_NEAR(p(0), p(3), 1e-12);
  EXPECT_NEAR(p(1), p(2), 1e-12);
  EXPECT_LT(p(1), p(0));
}

// Draws follow the probabilities candidates() gives, penalties included, and
// a banned token is never drawn.
TEST(Sampling, DrawsFollowTheAdjustedProbabilities) {
  const std::vector<float> logits{1.0f, 0.5f, 0.0f, 2.0f};
  SamplingConfig c;
  c.seed = 3;
  c.repetition_penalty = 1.5f;
  c.logit_bias = {{3, -INFINITY}};
  const std::vector<int32_t> prompt{0};
  models::Sampler ref(c);
  ref.set_prompt(prompt);
  const auto want = ref.candidates(logits);
  ASSERT_EQ(want.size(), 3u);
  std::map<int32_t, int> count;
  const int n = 20000;
  models::Sampler s(c);
  for (int i = 0; i < n; ++i) {
    s.set_prompt(prompt);  // the same history for every draw
    ++count[s.sample(logits)];
  }
  EXPECT_EQ(count.count(3), 0u);
  for (const auto& [id, prob] : want) EXPECT_NEAR(double(count[id]) / n, prob, 0.015) << id;
}

TEST(Sampling, Errors) {
  auto make_and_run = [](auto set) {
    SamplingConfig c;
    set(c);
    models::Sampler s(c);
    return 0;
  };
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) { c.min_p = 1.5f; }), "sample", "min_p");
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) { c.repetition_penalty = 0; }), "sample",
                    "repetition_penalty");
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) { c.presence_penalty = NAN; }), "sample",
                    "presence_penalty");
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) { c.penalty_last_n = -1; }), "sample",
                    "penalty_last_n");
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) {
                      c.logit_bias = {{-4, 1.0f}};
                    }),
                    "sample", "logit_bias", "-4");
  EXPECT_KILN_ERROR(make_and_run([](SamplingConfig& c) {
                      c.logit_bias = {{2, INFINITY}};
                    }),
                    "sample", "logit_bias");
  const std::vector<float> logits{1.0f, 2.0f};
  SamplingConfig c;
  c.logit_bias = {{5, 1.0f}};
  EXPECT_KILN_ERROR(models::Sampler(c).candidates(logits), "sample", "logit_bias", "5",
                    "vocabulary of 2");
  c.logit_bias = {{0, -INFINITY}, {1, -INFINITY}};
  EXPECT_KILN_ERROR(models::Sampler(c).sample(logits), "sample", "banned");
}

// The text before the first stop string comes out, held back only while it may
// still be the start of one; the stop string never does.
TEST(StopStrings, CutsAtTheFirstStopAcrossPieces) {
  models::StopStrings s({"</s>", "\nUser:"});
  std::string out;
  for (const char* piece : {"Hello", " wor", "ld<", "/", "s", ">never"}) out += s.feed(piece);
  EXPECT_EQ(out, "Hello world");
  EXPECT_TRUE(s.stopped());
  EXPECT_EQ(s.feed("more"), "");
  EXPECT_EQ(s.flush(), "");

  models::StopStrings t({"\nUser:"});
  EXPECT_EQ(t.feed("a\nUs"), "a");  // "\nUs" may start the stop string
  EXPECT_EQ(t.feed("e"), "");
  EXPECT_EQ(t.feed("d"), "\nUsed");  // it did not
  EXPECT_EQ(t.feed("\n"), "");
  EXPECT_EQ(t.flush(), "\n");  // the end: what was held back
  EXPECT_FALSE(t.stopped());

  models::StopStrings u({"bc", "abcd"});  // the earliest match wins, whichever string
  EXPECT_EQ(u.feed("xabcd"), "x");
  models::StopStrings none({});
  EXPECT_EQ(none.feed("<anything>"), "<anything>");
  EXPECT_KILN_ERROR(models::StopStrings({"ok", ""}), "stop strings", "empty");
}

// generation_config.json's sampling settings become the defaults; do_sample
// false makes them greedy; fields it does not give keep the fallback's.
TEST(Sampling, DefaultsFromGenerationConfig) {
  models::GenerationConfig g;
  models::parse_generation_config(
      R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9, "eos_token_id": [1, 2],
          "repetition_penalty": 1.1, "max_length": 4096, "pad_token_id": 0})",
      "generation_config.json", g);
  SamplingConfig fallback;
  fallback.top_k = 40;
  fallback.top_p = 0.95f;
  SamplingConfig c = models::default_sampling(g, fallback);
  EXPECT_FLOAT_EQ(c.temperature, 0.6f);
  EXPECT_FLOAT_EQ(c.top_p, 0.9f);
  EXPECT_EQ(c.top_k, 40);
  EXPECT_FLOAT_EQ(c.repetition_penalty, 1.1f);
  models::GenerationConfig greedy;
  models::parse_generation_config(R"({"do_sample": false, "temperature": 0.6})", "g.json", greedy);
  EXPECT_EQ(models::default_sampling(greedy, fallback).temperature, 0.0f);
  EXPECT_EQ(models::default_sampling(models::GenerationConfig{}, fallback).top_p, 0.95f);
  models::GenerationConfig bad;
  EXPECT_KILN_ERROR(models::parse_generation_config(R"({"top_k": "many"})", "gen.json", bad),
                    "models", "gen.json", "top_k");
}

// The Generator applies the penalties to the prompt and the tokens it
// generates: with a huge presence penalty greedy decoding never repeats a token.
TEST(Sampling, GeneratorAppliesPenalties) {
  Context ctx;
  CpuBackend cpu{1};
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("qwen3_qknorm_f16"));
  models::Generator gen(*model, cpu);
  models::GenerateOptions o;
  o.max_new_tokens = 24;
  o.ignore_eos = true;
  o.sampling.temperature = 0;
  o.sampling.presence_penalty = 1e4f;
  const std::vector<int32_t> prompt{3, 4, 5};
  const std::vector<int32_t> ids = gen.generate(prompt, o).ids;
  ASSERT_EQ(ids.size(), 24u);
  EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), ids.size());
  o.sampling.presence_penalty = 0;  // without it, this small model repeats itself
  const std::vector<int32_t> plain = gen.generate(prompt, o).ids;
  EXPECT_LT(std::set<int32_t>(plain.begin(), plain.end()).size(), plain.size());
}

}  // namespace
}  // namespace kiln::test
