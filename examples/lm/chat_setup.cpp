// kiln-lm chat and serve's template and reply ends (chat_setup.h).
#include "chat_setup.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "kiln/error.h"
#include "kiln/io.h"

namespace lm {
namespace {

// The token that ends an assistant's turn in this template: render a reply
// and read the first token after it (<|im_end|>, <|eot_id|>, </s>, ...), if it
// is a special token.
std::optional<int32_t> end_of_turn(const kiln::chat::ChatTemplate& t, const kiln::Tokenizer& tok) {
  const std::string mark = "kiln-end-of-turn-probe";
  const nlohmann::json request = {
      {"messages",
       {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", mark}}}}};
  std::string text;
  try {
    text = t.apply(request.dump(), false);
  } catch (const kiln::Error&) {
    return std::nullopt;  // a template that refuses this conversation: eos ids alone
  }
  const size_t at = text.rfind(mark);
  if (at == std::string::npos) return std::nullopt;
  const std::vector<int32_t> after = tok.encode(text.substr(at + mark.size()), false);
  if (after.empty() || !tok.is_special(after[0])) return std::nullopt;
  return after[0];
}

}  // namespace

kiln::chat::ChatTemplate load_chat_template(const std::string& model, const std::string& name) {
  if (std::filesystem::is_directory(model)) return kiln::chat::ChatTemplate::load(model, name);
  const kiln::GgufFile file(model);
  return kiln::chat::ChatTemplate::from_gguf(file, name);
}

std::vector<int64_t> reply_end_ids(const kiln::models::CausalLM& model, const kiln::Tokenizer& tok,
                                   const kiln::chat::ChatTemplate& tmpl, const char* command,
                                   const std::string& model_path) {
  std::vector<int64_t> ids = model.config().generation.eos_token_ids;
  if (tok.eos_id()) ids.push_back(*tok.eos_id());
  if (const std::optional<int32_t> eot = end_of_turn(tmpl, tok)) ids.push_back(*eot);
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (ids.empty())
    kiln::fail(command, model_path,
               " names no end-of-sequence token and its template ends "
               "no turn with a special token: replies could not end");
  return ids;
}

}  // namespace lm
