// kiln-lm eval-chat: greedy replies to held-out conversations, scored against
// their last assistant message (reply_metrics.h): exact-match rate and unit
// error rate (edit distance over whitespace-separated units, e.g. phonemes,
// per reference unit). Each conversation's messages but the last are rendered
// with the model's chat template and add_generation_prompt, as kiln-lm chat
// and finetune render them; the reply ends at an end-of-turn or eos id.
//   kiln-lm eval-chat --model DIR|FILE.gguf --data FILE.jsonl [--adapter A] [--limit N]
//                     [--max-tokens 32] [--show 5] [--threads N]
// Ends with "examples=N exact_match=… per=… edits=… ref_units=… eval_time_s=…"
// (per: the unit error rate; the phoneme error rate on CMUdict's conversations).
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "chat_setup.h"
#include "commands.h"
#include "kiln/error.h"
#include "lm_model.h"
#include "reply_metrics.h"

namespace lm {
namespace {

constexpr const char* kEvalChatCmd = "kiln-lm eval-chat";

struct EvalChatOptions {
  std::string model, adapter, data, template_name;
  int64_t limit = 0, max_tokens = 32, show = 5;
  int threads = 0;
};

// A conversation's prompt (every message but the last, as a request) and the
// reference reply (the last message, the assistant's).
struct HeldOutTurn {
  std::string request, reference;
};

HeldOutTurn held_out_turn(const std::string& line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::exception& e) {
    kiln::fail(kEvalChatCmd, where, ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("messages") || !j["messages"].is_array() ||
      j["messages"].size() < 2)
    kiln::fail(kEvalChatCmd, where, ": needs \"messages\" with a prompt and a reply to score");
  nlohmann::json messages = j["messages"];
  const nlohmann::json last = messages.back();
  if (!last.is_object() || last.value("role", "") != "assistant" || !last.contains("content") ||
      !last["content"].is_string())
    kiln::fail(kEvalChatCmd, where,
               ": the last message must be the assistant's, with text content");
  messages.erase(messages.size() - 1);
  nlohmann::json request = j;
  request["messages"] = messages;
  return {request.dump(), last["content"].get<std::string>()};
}

int run_eval_chat(const EvalChatOptions& o) {
  std::ifstream in(o.data, std::ios::binary);
  if (!in) kiln::fail(kEvalChatCmd, "cannot open --data ", o.data);
  std::unique_ptr<LoadedModel> m = load_model(o.model, o.threads, 0, o.adapter);
  if (!m->tokenizer) kiln::fail(kEvalChatCmd, o.model, " has no tokenizer");
  const kiln::Tokenizer& tok = *m->tokenizer;
  const kiln::chat::ChatTemplate tmpl = load_chat_template(o.model, o.template_name);
  kiln::models::GenerateOptions opt;
  opt.max_new_tokens = o.max_tokens;
  opt.sampling.temperature = 0;  // greedy
  opt.eos_token_ids = reply_end_ids(*m->model, tok, tmpl, kEvalChatCmd, o.model);
  kiln::models::Generator gen(*m->model, *m->cpu);

  ReplyScores scores;
  int64_t line_no = 0, new_tokens = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    if (o.limit > 0 && scores.examples >= o.limit) break;
    const HeldOutTurn turn = held_out_turn(line, o.data + ":" + std::to_string(line_no));
    const std::vector<int32_t> prompt = tok.encode(tmpl.apply(turn.request, true), false);
    if (int64_t(prompt.size()) + o.max_tokens > gen.capacity())
      kiln::fail(kEvalChatCmd, o.data, ":", line_no, ": the prompt (", prompt.size(),
                 " tokens) and --max-tokens ", o.max_tokens, " exceed the model's context (",
                 gen.capacity(), ")");
    kiln::models::GenerationResult r = gen.generate(prompt, opt);
    new_tokens += int64_t(r.ids.size());
    if (r.stop == kiln::models::StopReason::eos && !r.ids.empty()) r.ids.pop_back();
    const std::string reply = tok.decode(r.ids, true);
    scores.add(reply, turn.reference);
    if (scores.examples <= o.show)
      std::fprintf(stderr, "%s: line %lld: reply '%s', reference '%s' (%lld edits)\n", kEvalChatCmd,
                   (long long)line_no, reply.c_str(), turn.reference.c_str(),
                   (long long)unit_edit_distance(reply, turn.reference));
  }
  if (scores.examples == 0) kiln::fail(kEvalChatCmd, o.data, " holds no conversations");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf(
      "examples=%lld exact_match=%.4f per=%.4f edits=%lld ref_units=%lld new_tokens=%lld "
      "eval_time_s=%.1f\n",
      (long long)scores.examples, scores.exact_match(), scores.unit_error_rate(),
      (long long)scores.edits, (long long)scores.ref_units, (long long)new_tokens, seconds);
  return 0;
}

}  // namespace

Command add_eval_chat(CLI::App& app) {
  auto o = std::make_shared<EvalChatOptions>();
  CLI::App* c = app.add_subcommand(
      "eval-chat", "score greedy replies to JSONL conversations: exact match, unit error rate");
  c->add_option("--model", o->model, "a Hugging Face model directory or a .gguf file")->required();
  c->add_option("--data", o->data,
                "JSONL of {\"messages\": [...]}, each ending with the reference reply")
      ->required();
  c->add_option("--adapter", o->adapter, "a LoRA adapter: PEFT directory or GGUF file");
  c->add_option("--limit", o->limit, "score the first N conversations (0: all)")
      ->capture_default_str();
  c->add_option("--max-tokens", o->max_tokens, "tokens per reply at most")
      ->check(CLI::Range(int64_t(1), int64_t(1) << 20))
      ->capture_default_str();
  c->add_option("--show", o->show, "print the first N replies (stderr)")->capture_default_str();
  c->add_option("--template", o->template_name, "which of a list of named templates");
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  return {c, [o] { return run_eval_chat(*o); }};
}

}  // namespace lm
