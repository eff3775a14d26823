// kiln/chat_dataset.h: JSONL conversations rendered, tokenized and masked.
#if defined(KILN_HAVE_TOKENIZER)
#include "kiln/chat_dataset.h"

#include <algorithm>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <set>

#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/ops.h"
#include "kiln/tokenizer.h"

namespace kiln {
namespace {

using Json = nlohmann::ordered_json;  // keys in file order, as Python's dicts
constexpr const char* kOp = "chat data";

const std::set<std::string>& known_roles() {
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  return roles;
}

// Checks a list of messages; `what` names it ("messages", "prompt").
void check_messages(const Json& msgs, const char* what, const std::string& where) {
  if (!msgs.is_array()) fail(kOp, where, ": \"", what, "\" must be a list of messages");
  for (size_t i = 0; i < msgs.size(); ++i) {
    const Json& m = msgs[i];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      fail(kOp, where, ": ", what, "[", i, "] is not a {\"role\": ..., \"content\": ...} object");
    const std::string role = m["role"].get<std::string>();
    if (!known_roles().count(role))
      fail(kOp, where, ": ", what, "[", i, "] has the unknown role \"", role,
           "\" (known: system, developer, user, assistant, tool)");
  }
}

// The conversation tokenized once, and the token count of its text's prefixes.
class Rendered {
 public:
  Rendered(const chat::ChatTemplate& t, const Tokenizer& tok, const Json& msgs, const Json* tools,
           const std::string& where)
      : t_(t), tok_(tok), msgs_(msgs), tools_(tools), where_(where) {
    text_ = render(msgs.size(), false, &generation_);
    ids_ = tok.encode(text_, false);  // the template writes the special tokens itself
    // A template that ignores add_generation_prompt may end every render with
    // the generation prompt (the original Llama 3 template): what it renders
    // for no messages is that tail, and it is no turn's (tokens_before).
    if (render(msgs.size(), true) == text_) {
      try {
        always_tail_ = render(0, false);
      } catch (const Error&) {  // a template that needs messages: no such tail
      }
    }
  }
  const std::vector<int32_t>& ids() const { return ids_; }
  // The byte ranges {% generation %} blocks wrote (none without such blocks).
  const std::vector<std::pair<size_t, size_t>>& generation() const { return generation_; }

  // Tokens of the conversation's first `bytes` bytes of text.
  size_t tokens_of_prefix(size_t bytes, const std::string& what) const {
    const std::vector<int32_t> p = tok_.encode(std::string_view(text_).substr(0, bytes), false);
    if (p.size() > ids_.size() || !std::equal(p.begin(), p.end(), ids_.begin()))
      fail(kOp, where_, ": the tokens of the text before ", what,
           " are not a prefix of the conversation's tokens (the tokenizer merges across the "
           "boundary)");
    return p.size();
  }

  // Tokens of the conversation up to the end of messages[:n] rendered (with the
  // generation prompt: where message n's reply starts). `what` names the
  // boundary in errors.
  size_t tokens_before(size_t n, bool generation_prompt, const std::string& what) const {
    std::string prefix = render(n, generation_prompt);
    if (!generation_prompt && !always_tail_.empty() && prefix.size() >= always_tail_.size() &&
        prefix.compare(prefix.size() - always_tail_.size(), always_tail_.size(), always_tail_) == 0)
      prefix.resize(prefix.size() - always_tail_.size());
    if (text_.compare(0, prefix.size(), prefix) != 0)
      fail(kOp, where_, ": the chat template renders messages[:", n, "]",
           generation_prompt ? " with the generation prompt" : "",
           " as text that is not a prefix of the whole conversation's, so ", what,
           " cannot be found exactly (it renders earlier turns differently once later ones "
           "follow); train on prompt/completion pairs, use a template that marks the "
           "assistant's text with {% generation %}, or fix the template");
    return tokens_of_prefix(prefix.size(), what);
  }

 private:
  std::string render(size_t n, bool generation_prompt,
                     std::vector<std::pair<size_t, size_t>>* generation = nullptr) const {
    Json req = Json::object();
    Json head = Json::array();
    for (size_t i = 0; i < n; ++i) head.push_back(msgs_[i]);
    req["messages"] = std::move(head);
    if (tools_) req["tools"] = *tools_;
    try {
      if (!generation) return t_.apply(req.dump(), generation_prompt);
      chat::MarkedText m = t_.apply_marked(req.dump(), generation_prompt);
      *generation = std::move(m.generation);
      return std::move(m.text);
    } catch (const Error& e) {
      fail(kOp, where_, ": rendering messages[:", n, "]: ", e.what());
    }
  }
  const chat::ChatTemplate& t_;
  const Tokenizer& tok_;
  const Json& msgs_;
  const Json* tools_;
  std::string where_, text_, always_tail_;
  std::vector<int32_t> ids_;
  std::vector<std::pair<size_t, size_t>> generation_;
};

// Marks the tokens of {% generation %} blocks, as transformers'
// return_assistant_tokens_mask does. The k-th block is taken to be the k-th
// assistant message's (the templates that have blocks wrap each reply in one),
// so a completion's turns can be told from its prompt's.
void mark_generation_blocks(const Rendered& r, const Json& msgs, size_t first, ChatExample& ex,
                            const std::string& where) {
  size_t assistants = 0, before_first = 0;
  for (size_t i = 0; i < msgs.size(); ++i)
    if (msgs[i]["role"] == "assistant") {
      ++assistants;
      if (i < first) ++before_first;
    }
  const auto& spans = r.generation();
  if (first > 0 && spans.size() != assistants)
    fail(kOp, where, ": the chat template's {% generation %} blocks wrote ", spans.size(),
         " spans for ", assistants,
         " assistant messages, so the completion's cannot be told from the prompt's");
  for (size_t k = first > 0 ? before_first : 0; k < spans.size(); ++k) {
    const std::string what = "{% generation %} block " + std::to_string(k);
    const size_t begin = r.tokens_of_prefix(spans[k].first, "the start of " + what);
    const size_t end = r.tokens_of_prefix(spans[k].second, "the end of " + what);
    for (size_t t = begin; t < end; ++t) ex.trained[t] = 1;
  }
}

// A conversation: the assistant messages from index `first` on are trained.
ChatExample conversation(const Json& msgs, const Json* tools, size_t first, const Tokenizer& tok,
                         const chat::ChatTemplate* tmpl, TrainOn on, const std::string& where) {
  if (msgs.empty()) fail(kOp, where, ": the conversation is empty");
  if (!tmpl)
    fail(kOp, where, ": a conversation needs the model's chat template, and there is none");
  const Rendered r(*tmpl, tok, msgs, tools, where);
  ChatExample ex;
  ex.ids = r.ids();
  ex.trained.assign(ex.ids.size(), on == TrainOn::all ? 1 : 0);
  if (on == TrainOn::all) return ex;
  if (tmpl->jinja().has_generation_blocks()) {
    mark_generation_blocks(r, msgs, first, ex, where);
    if (std::find(ex.trained.begin(), ex.trained.end(), 1) == ex.trained.end())
      fail(kOp, where, ": the chat template's {% generation %} blocks mark no text to train on",
           " (--train-on all trains on every token)");
    return ex;
  }
  bool any = false;
  for (size_t i = first; i < msgs.size(); ++i) {
    if (msgs[i]["role"] != "assistant") continue;
    any = true;
    const std::string turn = "assistant turn messages[" + std::to_string(i) + "]";
    const size_t begin = r.tokens_before(i, true, "the start of " + turn);
    const size_t end = r.tokens_before(i + 1, false, "the end of " + turn);
    for (size_t k = begin; k < end; ++k) ex.trained[k] = 1;
  }
  if (!any)
    fail(kOp, where, ": the conversation has no assistant message to train on",
         first > 0 ? " in its completion" : "", " (--train-on all trains on every token)");
  return ex;
}

std::string string_field(const Json& j, const char* key, const std::string& where) {
  if (!j[key].is_string()) fail(kOp, where, ": \"", key, "\" must be a string or a message list");
  return j[key].get<std::string>();
}

}  // namespace

int64_t ChatExample::trained_count() const {
  int64_t n = 0;
  for (size_t k = 1; k < trained.size(); ++k) n += trained[k];  // token 0 is never a label
  return n;
}

ChatExample tokenize_chat_example(std::string_view json, const Tokenizer& tok,
                                  const chat::ChatTemplate* tmpl, TrainOn on,
                                  const std::string& where) {
  Json j;
  try {
    j = Json::parse(json);
  } catch (const nlohmann::json::exception& e) {
    fail(kOp, where, ": bad JSON: ", e.what());
  }
  if (!j.is_object()) fail(kOp, where, ": expected a JSON object, got ", j.type_name());
  const Json* tools = j.contains("tools") && !j["tools"].is_null() ? &j["tools"] : nullptr;
  if (tools && !tools->is_array()) fail(kOp, where, ": \"tools\" must be a list");
  ChatExample ex;
  if (j.contains("messages")) {
    check_messages(j["messages"], "messages", where);
    ex = conversation(j["messages"], tools, 0, tok, tmpl, on, where);
  } else if (j.contains("prompt") || j.contains("completion")) {
    if (!j.contains("prompt") || !j.contains("completion"))
      fail(kOp, where, ": \"prompt\" and \"completion\" come together");
    if (j["prompt"].is_array()) {  // conversational: prompt messages, then completion messages
      check_messages(j["prompt"], "prompt", where);
      check_messages(j["completion"], "completion", where);
      Json all = j["prompt"];
      for (const Json& m : j["completion"]) all.push_back(m);
      ex = conversation(all, tools, j["prompt"].size(), tok, tmpl, on, where);
    } else {
      const std::string prompt = string_field(j, "prompt", where);
      const std::string completion = string_field(j, "completion", where);
      ex.ids = tok.encode(prompt, true);
      const size_t n_prompt = ex.ids.size();
      const std::vector<int32_t> c = tok.encode(completion, false);
      ex.ids.insert(ex.ids.end(), c.begin(), c.end());
      if (tok.eos_id()) ex.ids.push_back(*tok.eos_id());  // the model learns to stop
      ex.trained.assign(ex.ids.size(), 1);
      if (on == TrainOn::assistant) std::fill_n(ex.trained.begin(), n_prompt, 0);
    }
  } else if (j.contains("text")) {
    ex.ids = tok.encode(string_field(j, "text", where), true);
    ex.trained.assign(ex.ids.size(), 1);
  } else {
    fail(kOp, where, ": expected \"messages\", \"prompt\" and \"completion\", or \"text\"");
  }
  if (ex.trained_count() == 0)
    fail(kOp, where, ": the example has no token to train on (", ex.ids.size(), " tokens)");
  return ex;
}

ChatDataset load_chat_jsonl(const std::string& path, const Tokenizer& tok,
                            const chat::ChatTemplate* tmpl, const ChatDataOptions& o) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(kOp, path, ": cannot open the file");
  if (o.max_tokens < 0 || o.max_tokens == 1)
    fail(kOp, "max_tokens ", o.max_tokens, ": need 0 (no limit) or at least 2");
  ChatDataset d;
  d.file = path;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ChatExample ex =
        tokenize_chat_example(line, tok, tmpl, o.train_on, path + ":" + std::to_string(n));
    ex.line = n;
    if (o.max_tokens > 0 && int64_t(ex.ids.size()) > o.max_tokens) {
      if (o.truncate) {
        ex.ids.resize(size_t(o.max_tokens));
        ex.trained.resize(size_t(o.max_tokens));
        ++d.truncated;
      }
      // Skipped: too long, or cut before any trained token.
      if (!o.truncate || ex.trained_count() == 0) {
        if (o.truncate) --d.truncated;
        d.skipped_lines.push_back(n);
        continue;
      }
    }
    d.examples.push_back(std::move(ex));
  }
  if (in.bad()) fail(kOp, path, ": read error");
  if (d.examples.empty())
    fail(kOp, path, ": no examples", d.skipped_lines.empty() ? "" : " (every one is too long)");
  return d;
}

int64_t ChatDataset::longest() const {
  size_t m = 0;
  for (const ChatExample& e : examples) m = std::max(m, e.ids.size());
  return int64_t(m);
}

int64_t ChatDataset::trained_tokens() const {
  int64_t n = 0;
  for (const ChatExample& e : examples) n += e.trained_count();
  return n;
}

ChatDataset ChatDataset::split_off(double fraction) {
  if (!(fraction > 0 && fraction < 1)) fail(kOp, "split fraction ", fraction, " not in (0, 1)");
  const size_t n = size_t(double(examples.size()) * fraction);
  if (n == 0 || n == examples.size())
    fail(kOp, file, ": ", examples.size(), " examples cannot be split by ", fraction,
         " (each part needs at least one)");
  ChatDataset v;
  v.file = file;
  v.examples.assign(std::make_move_iterator(examples.end() - std::ptrdiff_t(n)),
                    std::make_move_iterator(examples.end()));
  examples.resize(examples.size() - n);
  return v;
}

void ChatDataset::write_batch(std::span<const int64_t> rows, Tensor inputs, Tensor labels) const {
  if (inputs.dtype() != DType::i32 || inputs.ndim() != 2)
    fail(kOp, "inputs ", inputs.label(), " must be i32 [B, T], got ", inputs.shape().str());
  const int64_t B = inputs.size(0), T = inputs.size(1);
  if (labels.dtype() != DType::i32 || labels.numel() != B * T)
    fail(kOp, "labels ", labels.label(), " must be i32 with B*T = ", B * T, " elements");
  if (int64_t(rows.size()) != B) fail(kOp, rows.size(), " rows for a batch of ", B);
  std::vector<int32_t> x(size_t(B * T), 0), y(size_t(B * T), kIgnoreIndex);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = rows[size_t(b)];
    if (r == -1) continue;
    if (r < 0 || r >= size()) fail(kOp, "row ", r, " outside the ", size(), " examples");
    const ChatExample& e = examples[size_t(r)];
    const int64_t n = int64_t(e.ids.size()) - 1;  // positions with a next token
    if (n > T)
      fail(kOp, file, ":", e.line, ": ", e.ids.size(), " tokens do not fit a window of ", T);
    for (int64_t p = 0; p < n; ++p) {
      x[size_t(b * T + p)] = e.ids[size_t(p)];
      if (e.trained[size_t(p + 1)]) y[size_t(b * T + p)] = e.ids[size_t(p + 1)];
    }
  }
  inputs.set<int32_t>(x);
  labels.set<int32_t>(y);
}

std::vector<int64_t> ChatDataset::training_rows(uint64_t seed, int64_t step, int64_t per_step,
                                                int64_t k, int64_t batch) const {
  if (size() == 0) fail(kOp, file, ": no examples to draw batches from");
  return epoch_rows(size(), seed, step, per_step, k, batch);
}

}  // namespace kiln
#endif
