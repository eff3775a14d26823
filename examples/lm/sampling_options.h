// The sampling options of kiln-lm generate and chat (kiln/sampling.h): added
// to a subcommand once, turned into a SamplingConfig once the model is known
// (generation_config.json's settings replace kiln-lm's defaults, and options
// given on the command line replace both).
#pragma once
#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "kiln/generate.h"

namespace lm {

struct SamplingOptions {
  kiln::models::SamplingConfig given{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
  std::vector<std::string> logit_bias, stop;
  bool seed_given = false;
  // The options that replace generation_config.json's settings when given.
  CLI::Option *temperature = nullptr, *top_k = nullptr, *top_p = nullptr, *min_p = nullptr,
              *repeat_penalty = nullptr;
};

// --temperature --top-k --top-p --min-p --repeat-penalty --presence-penalty
// --frequency-penalty --penalty-last-n --logit-bias --stop --seed.
void add_sampling_options(CLI::App* app, SamplingOptions& o);

// The config for a model with these generation settings; the seed is random
// unless --seed was given. `command` names the program in errors.
kiln::models::SamplingConfig sampling_config(const SamplingOptions& o,
                                             const kiln::models::GenerationConfig& g,
                                             const char* command);

}  // namespace lm
