// kiln-lm perplexity: the model's perplexity over a text file (or token ids),
// in consecutive windows of its context (or --ctx tokens); with --kl-base, also
// how far its next-token distributions are from a base model's (mean KL
// divergence, top-1 agreement: llama-perplexity --kl-divergence's figures).
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"

namespace lm {

namespace {

struct PerplexityOptions {
  std::string model, adapter, text, ids, kl_base, precision = "f32";
  int64_t ctx = 0;
  int threads = 0;
};

int run(const PerplexityOptions& o) {
  if (o.text.empty() == o.ids.empty())
    kiln::fail("kiln-lm perplexity", "give exactly one of --text and --ids");
  std::unique_ptr<LoadedModel> m =
      load_model_with_precision(o.model, o.threads, o.ctx, o.adapter, o.precision);
  std::vector<int32_t> ids;
  if (!o.ids.empty()) {
    ids = parse_ids(read_text(o.ids, "kiln-lm perplexity"), "--ids " + o.ids);
  } else {
    if (!m->tokenizer)
      kiln::fail("kiln-lm perplexity", o.model,
                 " has no tokenizer (tokenizer.json, or GGUF tokenizer.ggml.* keys): give "
                 "token ids with --ids FILE");
    ids = m->tokenizer->encode(read_text(o.text, "kiln-lm perplexity"));
  }
  if (!o.kl_base.empty()) {
    std::unique_ptr<LoadedModel> base =
        load_model_with_precision(o.kl_base, o.threads, o.ctx, "", o.precision);
    const kiln::models::KlDivergenceResult k =
        kiln::models::kl_divergence(*m->model, *base->model, *m->cpu, ids, o.ctx);
    std::printf("perplexity=%.4f\n", k.perplexity);
    std::printf("base_perplexity=%.4f\n", k.base_perplexity);
    std::printf("mean_kl=%.6f max_kl=%.6f top1_agreement=%.2f%%\n", k.mean_kl, k.max_kl,
                100.0 * k.top1_agreement);
    std::fprintf(stderr, "%lld tokens, %lld predicted; %.3f s\n", (long long)ids.size(),
                 (long long)k.predicted, k.seconds);
    return 0;
  }
  kiln::models::PerplexityResult r = kiln::models::perplexity(*m->model, *m->cpu, ids, o.ctx);
  std::printf("perplexity=%.4f\n", r.perplexity);
  std::fprintf(stderr,
               "%lld tokens, %lld predicted in %lld window%s of %lld; mean NLL %.4f nats; "
               "%.3f s (%.1f tokens/s)\n",
               (long long)ids.size(), (long long)r.predicted, (long long)r.windows,
               r.windows == 1 ? "" : "s", (long long)(o.ctx > 0 ? o.ctx : m->model->max_seq_len()),
               r.mean_nll, r.seconds, r.seconds > 0 ? double(ids.size()) / r.seconds : 0.0);
  return 0;
}

}  // namespace

Command add_perplexity(CLI::App& app) {
  auto o = std::make_shared<PerplexityOptions>();
  CLI::App* s = app.add_subcommand("perplexity", "perplexity of a model over a text");
  s->add_option("--model", o->model, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("--adapter", o->adapter,
                "a LoRA adapter: PEFT directory or GGUF file (kiln-lm finetune --out)");
  s->add_option("--text", o->text, "a text file (encoded with the model's tokenizer)");
  s->add_option("--ids", o->ids, "a file of token ids (separated by commas, spaces or lines)");
  s->add_option("--kl-base", o->kl_base,
                "a base model (directory or .gguf): also the mean KL divergence of the model's "
                "next-token distributions from the base's, and their top-1 agreement");
  s->add_option("--ctx", o->ctx, "window length in tokens (default: the model's context)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  add_precision_option(s, o->precision);
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
