// kiln-lm generate: text (or token ids) from a prompt with the KV-cache
// Generator (kiln/generate.h), streamed as the tokens come; the prompt and
// generation speeds go to stderr at the end. --adapter DIR adds a PEFT LoRA
// adapter (kiln-lm finetune's output), merged into the weights.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"

namespace lm {

namespace {

struct GenerateOptions {
  std::string model, adapter, prompt, prompt_ids, precision = "f32";
  int64_t max_tokens = 128, ctx = 0;
  // Sampling: kiln-lm's defaults, then generation_config.json's, then what the
  // user gives (`given`: the options given on the command line).
  kiln::models::SamplingConfig sampling{.temperature = 0.8f, .top_k = 40, .top_p = 0.95f};
  std::vector<std::string> logit_bias, stop;
  // The options that replace generation_config.json's settings when given.
  CLI::Option *temperature = nullptr, *top_k = nullptr, *top_p = nullptr, *min_p = nullptr,
              *repeat_penalty = nullptr;
  bool seed_given = false, print_ids = false, ignore_eos = false;
  int threads = 0;
};

// ID=BIAS (BIAS a number, or -inf to ban the token).
std::pair<int32_t, float> parse_logit_bias(const std::string& s) {
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
    kiln::fail("kiln-lm generate", "--logit-bias takes ID=BIAS (e.g. 13=-inf or 42=2.5), got '", s,
               "'");
  }
}

// The sampling config: generation_config.json's settings over kiln-lm's
// defaults, then every option given on the command line over those.
kiln::models::SamplingConfig sampling_config(const GenerateOptions& o,
                                             const kiln::models::GenerationConfig& g) {
  kiln::models::SamplingConfig c = kiln::models::default_sampling(g, GenerateOptions{}.sampling);
  const kiln::models::SamplingConfig& u = o.sampling;
  if (o.temperature->count()) c.temperature = u.temperature;
  if (o.top_k->count()) c.top_k = u.top_k;
  if (o.top_p->count()) c.top_p = u.top_p;
  if (o.min_p->count()) c.min_p = u.min_p;
  if (o.repeat_penalty->count()) c.repetition_penalty = u.repetition_penalty;
  c.presence_penalty = u.presence_penalty;
  c.frequency_penalty = u.frequency_penalty;
  c.penalty_last_n = u.penalty_last_n;
  c.seed = u.seed;
  for (const std::string& b : o.logit_bias) c.logit_bias.push_back(parse_logit_bias(b));
  return c;
}

int run(GenerateOptions& o) {
  if (o.prompt.empty() == o.prompt_ids.empty())
    kiln::fail("kiln-lm generate", "give exactly one of --prompt and --prompt-ids");
  std::unique_ptr<LoadedModel> m =
      load_model_with_precision(o.model, o.threads, o.ctx, o.adapter, o.precision);
  const bool ids_out = o.print_ids || !m->tokenizer;
  std::vector<int32_t> prompt;
  if (!o.prompt_ids.empty()) {
    prompt = parse_ids(o.prompt_ids, "--prompt-ids");
  } else {
    if (!m->tokenizer)
      kiln::fail("kiln-lm generate", o.model,
                 " has no tokenizer (tokenizer.json, or GGUF tokenizer.ggml.* keys): give the "
                 "prompt as --prompt-ids");
    prompt = m->tokenizer->encode(o.prompt);
  }
  if (!o.stop.empty() && ids_out)
    kiln::fail("kiln-lm generate", "--stop needs text output (a tokenizer, no --print-ids)");
  if (!o.seed_given) o.sampling.seed = std::random_device{}();

  kiln::models::GeneratorOptions go;
  // The cache holds what this run needs (prompt + new tokens) unless --ctx says more.
  go.max_seq_len = o.ctx > 0
                       ? o.ctx
                       : std::min(m->model->max_seq_len(),
                                  int64_t(prompt.size()) + std::max<int64_t>(o.max_tokens, 1));
  kiln::models::Generator gen(*m->model, *m->cpu, go);
  kiln::models::GenerateOptions opt;
  opt.max_new_tokens = o.max_tokens;
  opt.sampling = sampling_config(o, m->model->config().generation);
  opt.ignore_eos = o.ignore_eos;
  kiln::models::StopStrings stops(o.stop);
  if (opt.eos_token_ids.empty() && m->model->config().generation.eos_token_ids.empty() &&
      m->tokenizer && m->tokenizer->eos_id())
    opt.eos_token_ids = {*m->tokenizer->eos_id()};

  std::unique_ptr<kiln::StreamDecoder> dec;
  if (ids_out) {
    std::printf("prompt ids:");
    for (int32_t id : prompt) std::printf(" %d", id);
    std::printf("\nnew ids:");
  } else {
    dec = std::make_unique<kiln::StreamDecoder>(*m->tokenizer, true);
    for (int32_t id : prompt) std::fputs(dec->push(id).c_str(), stdout);
  }
  std::fflush(stdout);
  kiln::models::GenerationResult r = gen.generate(prompt, opt, [&](int32_t id) {
    if (dec) std::fputs(stops.feed(dec->push(id)).c_str(), stdout);
    else std::printf(" %d", id);
    std::fflush(stdout);
    return !stops.stopped();
  });
  if (dec) {
    std::fputs(stops.feed(dec->flush()).c_str(), stdout);
    std::fputs(stops.flush().c_str(), stdout);
  }
  std::printf("\n");
  std::fflush(stdout);  // the text before the speeds on stderr
  const kiln::models::GenerationStats& s = r.stats;
  std::fprintf(stderr,
               "prompt: %lld tokens in %.3f s (%.1f tokens/s); generation: %lld tokens, %lld "
               "decode steps in %.3f s (%.2f tokens/s); stop: %s; seed %llu; load %.2f s\n",
               (long long)s.prompt_tokens, s.prompt_seconds, s.prompt_tokens_per_s(),
               (long long)s.new_tokens, (long long)s.decode_steps, s.decode_seconds,
               s.decode_tokens_per_s(),
               stops.stopped() ? "stop string" : kiln::models::stop_reason_name(r.stop),
               (unsigned long long)opt.sampling.seed, m->load_seconds);
  return 0;
}

}  // namespace

Command add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  CLI::App* s = app.add_subcommand("generate", "generate text with a KV cache");
  s->add_option("--model", o->model, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("--adapter", o->adapter, "a PEFT LoRA adapter directory (kiln-lm finetune --out)");
  s->add_option("--prompt", o->prompt, "the prompt text (needs the model's tokenizer)");
  s->add_option("--prompt-ids", o->prompt_ids, "the prompt as token ids: 1,2,3");
  s->add_option("--max-tokens", o->max_tokens, "tokens to generate at most")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  kiln::models::SamplingConfig& c = o->sampling;
  o->temperature = s->add_option("--temperature", c.temperature,
                                 "0: greedy (default 0.8, or generation_config.json's)")
                       ->check(CLI::Range(0.0f, 1e6f));
  o->top_k = s->add_option("--top-k", c.top_k, "keep the k most likely tokens; 0: all (default 40)")
                 ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  o->top_p =
      s->add_option("--top-p", c.top_p,
                    "keep the most likely tokens up to this probability; 1: all (default 0.95)")
          ->check(CLI::Range(1e-6f, 1.0f));
  o->min_p =
      s->add_option("--min-p", c.min_p,
                    "keep tokens at least this fraction as likely as the most likely; 0: all")
          ->check(CLI::Range(0.0f, 1.0f));
  o->repeat_penalty =
      s->add_option("--repeat-penalty", c.repetition_penalty,
                    "divide the positive logits of tokens in the history by this (multiply "
                    "the negative ones); 1: off")
          ->check(CLI::Range(1e-6f, 1e6f));
  s->add_option("--presence-penalty", c.presence_penalty,
                "subtract this from the logits of tokens generated so far; 0: off");
  s->add_option("--frequency-penalty", c.frequency_penalty,
                "subtract this times the count of each token generated so far; 0: off");
  s->add_option("--penalty-last-n", c.penalty_last_n,
                "the penalties look at this many recent tokens; 0: all")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_option("--logit-bias", o->logit_bias, "ID=BIAS added to a token's logit (-inf bans it)");
  s->add_option("--stop", o->stop, "stop before this text (not printed); may be repeated");
  s->add_option_function<uint64_t>(
      "--seed",
      [o](uint64_t v) {
        o->sampling.seed = v;
        o->seed_given = true;
      },
      "sampling seed (default: random; the one used is printed)");
  s->add_option("--ctx", o->ctx, "positions of the KV cache (default: the model's context)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_flag("--print-ids", o->print_ids, "print token ids instead of text");
  s->add_flag("--ignore-eos", o->ignore_eos, "do not stop at the model's end-of-sequence ids");
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  add_precision_option(s, o->precision);
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
