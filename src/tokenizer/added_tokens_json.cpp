// kiln::add_special_tokens_json: new special tokens in a tokenizer.json's
// added_tokens, with ids after the highest one the file uses.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace kiln {

std::string add_special_tokens_json(std::string_view tokenizer_json,
                                    std::span<const std::string> tokens, const std::string& what) {
  // ordered_json: the file keeps its key order (merges, vocab) when written back.
  using Json = nlohmann::ordered_json;
  Json j;
  try {
    j = Json::parse(tokenizer_json);
  } catch (const Json::exception& e) {
    fail("tokenizer", what, ": not valid JSON: ", e.what());
  }
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object())
    fail("tokenizer", what, ": no \"model\" object (not a tokenizer.json)");
  const Json& vocab = j["model"].contains("vocab") ? j["model"]["vocab"] : Json();
  if (!vocab.is_object())
    fail("tokenizer", what,
         ": model.vocab is not an object of token -> id (kiln reads BPE models)");
  if (!j.contains("added_tokens") || j["added_tokens"].is_null()) j["added_tokens"] = Json::array();
  Json& added = j["added_tokens"];
  if (!added.is_array()) fail("tokenizer", what, ": added_tokens is not an array");
  int64_t next = 0;
  auto present = [&](const std::string& t) {
    if (vocab.contains(t)) return true;
    for (const Json& a : added)
      if (a.is_object() && a.contains("content") && a["content"] == t) return true;
    return false;
  };
  for (const auto& [token, id] : vocab.items())
    if (id.is_number_integer()) next = std::max<int64_t>(next, id.get<int64_t>() + 1);
  for (const Json& a : added)
    if (a.is_object() && a.contains("id") && a["id"].is_number_integer())
      next = std::max<int64_t>(next, a["id"].get<int64_t>() + 1);
  for (const std::string& t : tokens) {
    if (t.empty()) fail("tokenizer", what, ": an added token may not be empty");
    if (present(t)) continue;
    Json a = Json::object();
    a["id"] = next++;
    a["content"] = t;
    a["single_word"] = false;
    a["lstrip"] = false;
    a["rstrip"] = false;
    a["normalized"] = false;
    a["special"] = true;
    added.push_back(std::move(a));
  }
  return j.dump(2);
}

}  // namespace kiln
