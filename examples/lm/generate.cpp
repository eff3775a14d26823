// kiln-lm generate: text (or token ids) from a prompt with the KV-cache
// Generator (kiln/generate.h), streamed as the tokens come; the prompt and
// generation speeds go to stderr at the end. --adapter DIR|FILE.gguf adds a
// LoRA adapter (PEFT's directory or a GGUF adapter file: kiln-lm finetune's
// output), merged into the weights.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"
#include "sampling_options.h"

namespace lm {

namespace {

struct GenerateOptions {
  std::string model, adapter, prompt, prompt_ids, precision = "f32";
  int64_t max_tokens = 128, ctx = 0;
  SamplingOptions sampling;
  bool print_ids = false, ignore_eos = false, no_echo = false;
  int threads = 0;
};

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
  if (!o.sampling.stop.empty() && ids_out)
    kiln::fail("kiln-lm generate", "--stop needs text output (a tokenizer, no --print-ids)");

  kiln::models::GeneratorOptions go;
  // The cache holds what this run needs (prompt + new tokens) unless --ctx says more.
  go.max_seq_len = o.ctx > 0
                       ? o.ctx
                       : std::min(m->model->max_seq_len(),
                                  int64_t(prompt.size()) + std::max<int64_t>(o.max_tokens, 1));
  kiln::models::Generator gen(*m->model, *m->cpu, go);
  kiln::models::GenerateOptions opt;
  opt.max_new_tokens = o.max_tokens;
  opt.sampling = sampling_config(o.sampling, m->model->config().generation, "kiln-lm generate");
  opt.ignore_eos = o.ignore_eos;
  kiln::models::StopStrings stops(o.sampling.stop);
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
    if (!o.no_echo)
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
  s->add_option("--adapter", o->adapter,
                "a LoRA adapter: PEFT directory or GGUF file (kiln-lm finetune --out)");
  s->add_option("--prompt", o->prompt, "the prompt text (needs the model's tokenizer)");
  s->add_option("--prompt-ids", o->prompt_ids, "the prompt as token ids: 1,2,3");
  s->add_option("--max-tokens", o->max_tokens, "tokens to generate at most")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  add_sampling_options(s, o->sampling);
  s->add_option("--ctx", o->ctx, "positions of the KV cache (default: the model's context)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_flag("--print-ids", o->print_ids, "print token ids instead of text");
  s->add_flag("--no-echo", o->no_echo,
              "print only the new text, decoded on its own (as kiln-lm serve's replies)");
  s->add_flag("--ignore-eos", o->ignore_eos, "do not stop at the model's end-of-sequence ids");
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  add_precision_option(s, o->precision);
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
