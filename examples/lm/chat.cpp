// kiln-lm chat: a conversation with an instruct model through its chat
// template (kiln/chat.h). Each turn renders the whole conversation, runs only
// the tokens the KV cache lacks (GenerateOptions::reuse_cache), streams the
// reply and stops at the end of the assistant's turn; then it runs the end of
// the turn ahead (Generator::prefill_uncached), so the next turn's time to
// first token is that of its new text alone. Lines typed at a
// terminal are edited with libedit where kiln-lm was built with it; piped
// input is read line by line (one user message per line).
//   kiln-lm chat --model DIR|FILE.gguf [--system TEXT] [--max-tokens N] [sampling options]
// Commands: /reset (forget the conversation), /exit (or end of input).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "chat_setup.h"
#include "commands.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "lm_model.h"
#include "sampling_options.h"

#if KILN_LM_HAVE_EDITLINE
#include <editline/readline.h>
#endif

namespace lm {
namespace {

using Json = nlohmann::ordered_json;

struct ChatOptions {
  std::string model, system, template_name, precision = "f32";
  int64_t max_tokens = 512, ctx = 0;
  SamplingOptions sampling;
  int threads = 0;
};

// One line of user input; nullopt at the end of input.
std::optional<std::string> read_line(bool tty) {
#if KILN_LM_HAVE_EDITLINE
  if (tty) {
    char* line = readline("> ");
    if (!line) return std::nullopt;
    std::string s(line);
    std::free(line);
    if (!s.empty()) add_history(s.c_str());
    return s;
  }
#else
  if (tty) std::fputs("> ", stderr);
#endif
  std::string s;
  if (!std::getline(std::cin, s)) return std::nullopt;
  return s;
}

int run(ChatOptions& o) {
  std::unique_ptr<LoadedModel> m =
      load_model_with_precision(o.model, o.threads, o.ctx, "", o.precision);
  // The cache: --ctx, else the model's context up to 4096 positions.
  const int64_t ctx = o.ctx > 0 ? o.ctx : std::min<int64_t>(m->model->max_seq_len(), 4096);
  if (!m->tokenizer)
    kiln::fail("kiln-lm chat", o.model,
               " has no tokenizer (tokenizer.json, or GGUF tokenizer.ggml.* keys)");
  const kiln::Tokenizer& tok = *m->tokenizer;
  const kiln::chat::ChatTemplate tmpl = load_chat_template(o.model, o.template_name);
  kiln::models::GenerateOptions opt;
  opt.max_new_tokens = o.max_tokens;
  opt.sampling = sampling_config(o.sampling, m->model->config().generation, "kiln-lm chat");
  opt.reuse_cache = true;
  opt.eos_token_ids = reply_end_ids(*m->model, tok, tmpl, "kiln-lm chat", o.model);
  kiln::models::Generator gen(*m->model, *m->cpu, {.max_seq_len = ctx});

  Json messages = Json::array();
  auto start = [&] {
    messages = Json::array();
    if (!o.system.empty()) messages.push_back({{"role", "system"}, {"content", o.system}});
  };
  start();
  const bool tty = isatty(STDIN_FILENO);
  std::string stop_ids;
  for (int64_t id : opt.eos_token_ids) stop_ids += " " + std::to_string(id);
  std::fprintf(
      stderr, "kiln-lm chat: %s (load %.2f s, seed %llu, turns end at ids%s); /reset, /exit\n",
      o.model.c_str(), m->load_seconds, (unsigned long long)opt.sampling.seed, stop_ids.c_str());
  while (std::optional<std::string> line = read_line(tty)) {
    if (*line == "/exit" || *line == "/quit") break;
    if (*line == "/reset") {
      start();
      gen.reset();
      std::fputs("(conversation reset)\n", stderr);
      continue;
    }
    if (line->empty()) continue;
    messages.push_back({{"role", "user"}, {"content", *line}});
    const std::string prompt = tmpl.apply(Json{{"messages", messages}}.dump(), true);
    const std::vector<int32_t> ids = tok.encode(prompt, false);
    if (int64_t(ids.size()) >= gen.capacity())
      kiln::fail("kiln-lm chat", "the conversation (", ids.size(), " tokens) fills the context of ",
                 gen.capacity(), " (--ctx, or /reset)");
    kiln::StreamDecoder dec(tok, true);
    kiln::models::StopStrings stops(o.sampling.stop);
    std::string reply;
    auto show = [&](const std::string& text) {
      reply += text;
      std::fputs(text.c_str(), stdout);
      std::fflush(stdout);
    };
    const kiln::models::GenerationResult r = gen.generate(ids, opt, [&](int32_t id) {
      show(stops.feed(dec.push(id)));
      return !stops.stopped();
    });
    show(stops.feed(dec.flush()));
    show(stops.flush());
    std::fputs("\n", stdout);
    std::fflush(stdout);
    messages.push_back({{"role", "assistant"}, {"content", reply}});
    // Run the end of the turn now, while the user reads: the template's
    // end-of-turn tokens, and the reply as the tokenizer splits its text
    // (which the sampled tokens need not be), so the next turn's prompt finds
    // all but its new text cached. Only a head start: a template that refuses
    // a conversation ending with the assistant leaves it to the next turn.
    int64_t ahead = 0;
    try {
      const std::vector<int32_t> history =
          tok.encode(tmpl.apply(Json{{"messages", messages}}.dump(), false), false);
      if (int64_t(history.size()) < gen.capacity()) ahead = gen.prefill_uncached(history);
    } catch (const kiln::Error&) {}
    const kiln::models::GenerationStats& s = r.stats;
    std::fprintf(stderr,
                 "[prefill %lld tokens (%lld cached) %.1f tokens/s, %.3f s; decode %lld tokens "
                 "%.2f tokens/s; stop: %s; %lld tokens of the turn's end run ahead]\n",
                 (long long)s.prompt_tokens, (long long)s.reused_tokens, s.prompt_tokens_per_s(),
                 s.prompt_seconds, (long long)s.new_tokens, s.decode_tokens_per_s(),
                 stops.stopped() ? "stop string" : kiln::models::stop_reason_name(r.stop),
                 (long long)ahead);
  }
  return 0;
}

}  // namespace

Command add_chat(CLI::App& app) {
  auto o = std::make_shared<ChatOptions>();
  CLI::App* s = app.add_subcommand("chat", "talk with an instruct model through its chat template");
  s->add_option("--model", o->model, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("--system", o->system, "a system message at the start of the conversation");
  s->add_option("--template", o->template_name,
                "which of a list of named chat templates (default: \"default\")");
  s->add_option("--max-tokens", o->max_tokens, "tokens per reply at most")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 40));
  s->add_option("--ctx", o->ctx,
                "positions of the KV cache: the conversation's length at most (default: the "
                "model's context, at most 4096)")
      ->check(CLI::Range(int64_t(0), int64_t(1) << 40));
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  add_sampling_options(s, o->sampling);
  add_precision_option(s, o->precision);
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
