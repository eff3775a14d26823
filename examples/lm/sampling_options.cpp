#include "sampling_options.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <stdexcept>
#include <utility>

#include "kiln/error.h"

namespace lm {
namespace {

// ID=BIAS (BIAS a number, or -inf to ban the token).
std::pair<int32_t, float> parse_logit_bias(const std::string& s, const char* command) {
  const size_t eq = s.find('=');
  try {
    if (eq == std::string::npos) throw std::invalid_argument(s);
    size_t used = 0;
    const long id = std::stol(s.substr(0, eq), &used);
    if (used != eq || id < 0 || id > INT32_MAX) throw std::invalid_argument(s);
    const std::string b = s.substr(eq + 1);
    const float bias = b == "-inf" ? -INFINITY : std::stof(b, &used);
    if (b != "-inf" && used != b.size()) throw std::invalid_argument(s);
    return {int32_t(id), bias};
  } catch (const std::exception&) {
    kiln::fail(command, "--logit-bias takes ID=BIAS (e.g. 13=-inf or 42=2.5), got '", s, "'");
  }
}

}  // namespace

void add_sampling_options(CLI::App* s, SamplingOptions& o) {
  kiln::models::SamplingConfig& c = o.given;
  o.temperature = s->add_option("--temperature", c.temperature,
                                "0: greedy (default 0.8, or generation_config.json's)")
                      ->check(CLI::Range(0.0f, 1e6f));
  o.top_k = s->add_option("--top-k", c.top_k, "keep the k most likely tokens; 0: all (default 40)")
                ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  o.top_p =
      s->add_option("--top-p", c.top_p,
                    "keep the most likely tokens up to this probability; 1: all (default 0.95)")
          ->check(CLI::Range(1e-6f, 1.0f));
  o.min_p = s->add_option("--min-p", c.min_p,
                          "keep tokens at least this fraction as likely as the most likely; 0: all")
                ->check(CLI::Range(0.0f, 1.0f));
  o.repeat_penalty = s->add_option("--repeat-penalty", c.repetition_penalty,
                                   "divide the positive logits of tokens in the history by this "
                                   "(multiply the negative ones); 1: off")
                         ->check(CLI::Range(1e-6f, 1e6f));
  s->add_option("--presence-penalty", c.presence_penalty,
                "subtract this from the logits of tokens generated so far; 0: off");
  s->add_option("--frequency-penalty", c.frequency_penalty,
                "subtract this times the count of each token generated so far; 0: off");
  s->add_option("--penalty-last-n", c.penalty_last_n,
                "the penalties look at this many recent tokens; 0: all")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_option("--logit-bias", o.logit_bias, "ID=BIAS added to a token's logit (-inf bans it)");
  s->add_option("--stop", o.stop, "stop before this text (not printed); may be repeated");
  s->add_option_function<uint64_t>(
      "--seed",
      [&o](uint64_t v) {
        o.given.seed = v;
        o.seed_given = true;
      },
      "sampling seed (default: random; the one used is printed)");
}

kiln::models::SamplingConfig sampling_config(const SamplingOptions& o,
                                             const kiln::models::GenerationConfig& g,
                                             const char* command) {
  kiln::models::SamplingConfig c = kiln::models::default_sampling(g, SamplingOptions{}.given);
  const kiln::models::SamplingConfig& u = o.given;
  if (o.temperature->count()) c.temperature = u.temperature;
  if (o.top_k->count()) c.top_k = u.top_k;
  if (o.top_p->count()) c.top_p = u.top_p;
  if (o.min_p->count()) c.min_p = u.min_p;
  if (o.repeat_penalty->count()) c.repetition_penalty = u.repetition_penalty;
  c.presence_penalty = u.presence_penalty;
  c.frequency_penalty = u.frequency_penalty;
  c.penalty_last_n = u.penalty_last_n;
  c.seed = o.seed_given ? u.seed : std::random_device{}();
  for (const std::string& b : o.logit_bias) c.logit_bias.push_back(parse_logit_bias(b, command));
  return c;
}

}  // namespace lm
