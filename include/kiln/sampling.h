// Picking the next token from logits (docs/models.md#sampling), and cutting
// streamed text at stop strings. kiln/generate.h uses both; a server or a chat
// loop may use them on their own.
//
//   kiln::models::SamplingConfig c;
//   c.temperature = 0.7f;
//   c.top_p = 0.9f;
//   c.repetition_penalty = 1.1f;
//   kiln::models::Sampler s(c);
//   s.set_prompt(prompt_ids);            // the penalties' history
//   int32_t id = s.sample(logits);       // recorded as generated
//
// The order of the steps, fixed (that of Hugging Face's generate for the
// filters, llama.cpp's for the penalties before them):
//   1. logit_bias added;
//   2. penalties on the tokens of the history window: repetition (prompt and
//      generated tokens), presence and frequency (generated tokens only);
//   3. temperature (0: greedy, the first of the largest adjusted logits; the
//      remaining steps do not apply);
//   4. top-k, 5. top-p, 6. min-p, each on what the step before kept;
//   7. a draw from what is left, in proportion to softmax(logits / T).
#pragma once
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kiln::models {

struct SamplingConfig {
  float temperature = 1.0f;  // 0: greedy (the first of the largest logits)
  int64_t top_k = 0;         // keep the k most likely tokens; 0: all
  float top_p = 1.0f;        // then the smallest set whose probability reaches top_p; 1: all
  float min_p = 0.0f;        // then those with probability >= min_p x the largest; 0: all
  // CTRL's repetition penalty as Hugging Face and llama.cpp apply it: the logit
  // l of a token in the window becomes l / p when l > 0, l * p otherwise. 1: off.
  float repetition_penalty = 1.0f;
  // OpenAI's: a generated token's logit minus presence_penalty (once) and
  // frequency_penalty x its count in the window. 0: off.
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  // Tokens of history (prompt then generated) the penalties look at, the most
  // recent ones. 0: all of it.
  int64_t penalty_last_n = 0;
  // Added to a token's logit before anything else (OpenAI's logit_bias); -inf
  // bans a token.
  std::vector<std::pair<int32_t, float>> logit_bias;
  uint64_t seed = 0;  // the same seed, logits, history and config give the same tokens

  // Any penalty set?
  bool has_penalties() const {
    return repetition_penalty != 1.0f || presence_penalty != 0.0f || frequency_penalty != 0.0f;
  }
};

// Picks tokens from logits. Probabilities are computed in double; ties in top-k
// and top-p keep the lower id first. Draws come from a 64-bit Mersenne Twister
// seeded with `seed` (the same on every platform). Errors (kiln::Error, "[sample]
// ..."): a config value out of range, NaN logits, a bias for an id outside the
// vocabulary, every token banned.
class Sampler {
 public:
  explicit Sampler(const SamplingConfig& cfg);
  // Starts a new history: the prompt's tokens (only the repetition penalty
  // looks at them). Generated tokens are added by sample() or accept().
  void set_prompt(std::span<const int32_t> ids);
  // Adds a generated token to the history (sample() does this itself).
  void accept(int32_t id);
  // The next token; recorded in the history as generated.
  int32_t sample(std::span<const float> logits);
  // The tokens sample() may return for these logits and their probabilities
  // (after every step above), most likely first. Changes no state.
  std::vector<std::pair<int32_t, double>> candidates(std::span<const float> logits);
  const SamplingConfig& config() const { return cfg_; }

 private:
  // Fills order_ (the kept tokens) and weight_ (their unnormalised
  // probabilities); returns the weights' sum.
  double select(std::span<const float> logits);
  void push(int32_t id, bool generated);
  SamplingConfig cfg_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> order_;
  std::vector<double> weight_;
  // The penalties' window: (id, generated) oldest first, and counts over it.
  std::vector<std::pair<int32_t, bool>> history_;
  size_t window_begin_ = 0;
  std::unordered_map<int32_t, int64_t> seen_, generated_;
};

// Cuts streamed text at the first of some stop strings (OpenAI's `stop`): feed()
// returns the text that can be shown now, holding back any tail that may be the
// start of a stop string; once one is found, the text before it is returned,
// stopped() is true and the stop string itself is never returned.
class StopStrings {
 public:
  // Errors: an empty stop string.
  explicit StopStrings(std::vector<std::string> stops);
  std::string feed(std::string_view text);
  // The held-back tail, at the end of generation (empty once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace kiln::models
