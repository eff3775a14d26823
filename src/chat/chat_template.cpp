// kiln/chat.h: parsing and rendering templates, and finding a model's chat
// template and special tokens as transformers' apply_chat_template does.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "chat/eval.h"
#include "chat/lexer.h"
#include "chat/parser.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/io.h"

namespace kiln::chat {
namespace {

using Json = nlohmann::ordered_json;  // keys stay in file order, as Python's dicts

constexpr int kMaxJsonDepth = 256;

Value from_json(const Json& j, const std::string& what, int depth) {
  if (depth > kMaxJsonDepth)
    fail(what.c_str(), "JSON nested deeper than ", kMaxJsonDepth, " levels");
  switch (j.type()) {
    case Json::value_t::null: return Value::none();
    case Json::value_t::boolean: return Value::boolean(j.get<bool>());
    case Json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case Json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > uint64_t(INT64_MAX)) return Value::number(double(u));
      return Value::integer(int64_t(u));
    }
    case Json::value_t::number_float: return Value::number(j.get<double>());
    case Json::value_t::string: return Value::string(j.get<std::string>());
    case Json::value_t::array: {
      Array items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(from_json(item, what, depth + 1));
      return Value::list(std::move(items));
    }
    case Json::value_t::object: {
      auto o = std::make_shared<Object>();
      for (const auto& [k, v] : j.items()) o->items.emplace_back(k, from_json(v, what, depth + 1));
      return Value::dict(std::move(o));
    }
    default: fail(what.c_str(), "unsupported JSON value");
  }
}

Json parse_json(std::string_view text, const std::string& what) {
  try {
    return Json::parse(text);
  } catch (const Json::exception& e) {
    fail(what.c_str(), "not valid JSON: ", e.what());
  }
}

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("chat template", "cannot read ", path.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token in tokenizer_config.json: "text" or {"content": "text", ...}.
std::optional<std::string> token_text(const Json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string())
    return j["content"].get<std::string>();
  return std::nullopt;
}

bool holds_generation(const Body& body) {
  for (const StmtPtr& s : body) {
    if (s->kind == Stmt::Kind::Generation || holds_generation(s->body) ||
        holds_generation(s->else_body))
      return true;
    for (const auto& branch : s->branches)
      if (holds_generation(branch.second)) return true;
  }
  return false;
}

}  // namespace

Template::Template(std::string_view source, std::string name) : name_(std::move(name)) {
  auto program = std::make_shared<Program>();
  program->body = parse(lex(source, name_), name_);
  program->has_generation = holds_generation(program->body);
  program_ = std::move(program);
}

Template::~Template() = default;
Template::Template(Template&&) noexcept = default;
Template& Template::operator=(Template&&) noexcept = default;

std::string Template::render(std::string_view variables_json, const Limits& limits) const {
  const std::string what = name_ + " variables";
  const Json j = variables_json.empty() ? Json::object() : parse_json(variables_json, what);
  if (!j.is_object())
    fail(what.c_str(), "expected a JSON object of variables, found ", j.type_name());
  return render_variables(from_json(j, what, 0).object, limits);
}

std::string Template::render_variables(std::shared_ptr<Object> variables, const Limits& limits,
                                       std::vector<std::pair<size_t, size_t>>* generation) const {
  Evaluator ev(name_, limits, std::move(variables));
  return ev.render(program_->body, generation);
}

bool Template::has_generation_blocks() const { return program_->has_generation; }

ChatTemplate ChatTemplate::from_config(std::string_view tokenizer_config_json,
                                       std::string_view template_jinja,
                                       const std::string& template_name, const std::string& what) {
  Json config = Json::object();
  if (!tokenizer_config_json.empty()) config = parse_json(tokenizer_config_json, what);
  if (!config.is_object()) fail(what.c_str(), "expected a JSON object");
  std::string source;
  std::string name = "chat template";
  const std::string wanted = template_name.empty() ? "default" : template_name;
  if (config.contains("chat_template") && !config["chat_template"].is_null()) {
    const Json& t = config["chat_template"];
    if (t.is_string()) {
      if (!template_name.empty() && template_name != "default")
        fail(what.c_str(), "has one chat template, not one named '", template_name, "'");
      source = t.get<std::string>();
    } else if (t.is_array()) {
      std::string names;
      bool found = false;
      for (const Json& entry : t) {
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          fail(what.c_str(),
               "chat_template list entries must be {\"name\": ..., \"template\": ...}");
        const std::string n = entry["name"].get<std::string>();
        names += (names.empty() ? "" : ", ") + n;
        if (n == wanted) {
          source = entry["template"].get<std::string>();
          found = true;
        }
      }
      if (!found)
        fail(what.c_str(), "has no chat template named '", wanted, "' (it has: ", names, ")");
      name = "chat template '" + wanted + "'";
    } else {
      fail(what.c_str(), "chat_template must be a string or a list of named templates");
    }
  } else if (!template_jinja.empty()) {
    if (!template_name.empty() && template_name != "default")
      fail(what.c_str(), "chat_template.jinja is one template, not one named '", template_name,
           "'");
    source = std::string(template_jinja);
    name = "chat_template.jinja";
  } else {
    fail(what.c_str(), "has no chat_template (and there is no chat_template.jinja)");
  }
  std::map<std::string, std::string> special;
  for (const auto& [key, value] : config.items()) {
    if (key.size() < 7 || key.compare(key.size() - 6, 6, "_token") != 0) continue;
    if (auto text = token_text(value)) special[key] = *text;
  }
  return ChatTemplate(Template(source, name), std::move(special));
}

ChatTemplate ChatTemplate::load(const std::string& dir, const std::string& template_name) {
  namespace fs = std::filesystem;
  const fs::path config = fs::path(dir) / "tokenizer_config.json";
  const fs::path jinja = fs::path(dir) / "chat_template.jinja";
  const bool has_config = fs::exists(config), has_jinja = fs::exists(jinja);
  if (!has_config && !has_jinja)
    fail("chat template", dir, " has neither tokenizer_config.json nor chat_template.jinja");
  return from_config(has_config ? read_file(config) : std::string(),
                     has_jinja ? read_file(jinja) : std::string(), template_name,
                     has_config ? config.string() : jinja.string());
}

ChatTemplate ChatTemplate::from_gguf(const GgufFile& file, const std::string& template_name) {
  const bool named = !template_name.empty() && template_name != "default";
  const std::string key =
      named ? "tokenizer.chat_template." + template_name : "tokenizer.chat_template";
  const GgufValue* source = file.find(key);
  if (!source) fail("chat template", file.path(), " has no ", key, " metadata");
  std::map<std::string, std::string> special;
  if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
    const std::vector<std::string>& vocab = tokens->as_strings();
    // llama.cpp's key names ("seperator" is its spelling) → transformers' variable names.
    const std::pair<const char*, const char*> ids[] = {
        {"tokenizer.ggml.bos_token_id", "bos_token"},
        {"tokenizer.ggml.eos_token_id", "eos_token"},
        {"tokenizer.ggml.unknown_token_id", "unk_token"},
        {"tokenizer.ggml.padding_token_id", "pad_token"},
        {"tokenizer.ggml.seperator_token_id", "sep_token"}};
    for (const auto& [gguf_key, name] : ids)
      if (const GgufValue* id = file.find(gguf_key)) {
        const uint64_t k = id->as_uint();
        if (k >= vocab.size())
          fail("chat template", file.path(), ": ", gguf_key, " = ", k,
               " is beyond the vocabulary (", vocab.size(), " tokens)");
        special[name] = vocab[size_t(k)];
      }
  }
  return ChatTemplate(Template(source->as_string(),
                               named ? "chat template '" + template_name + "'" : "chat template"),
                      std::move(special));
}

std::string ChatTemplate::apply(std::string_view request_json, bool add_generation_prompt,
                                const Limits& limits) const {
  return render_request(request_json, add_generation_prompt, limits, nullptr);
}

MarkedText ChatTemplate::apply_marked(std::string_view request_json, bool add_generation_prompt,
                                      const Limits& limits) const {
  MarkedText m;
  m.text = render_request(request_json, add_generation_prompt, limits, &m.generation);
  return m;
}

std::string ChatTemplate::render_request(std::string_view request_json, bool add_generation_prompt,
                                         const Limits& limits,
                                         std::vector<std::pair<size_t, size_t>>* generation) const {
  Json request = parse_json(request_json, "chat request");
  if (!request.is_object()) fail("chat request", "expected a JSON object with \"messages\"");
  if (!request.contains("messages") || !request["messages"].is_array())
    fail("chat request", "needs \"messages\": a list of {\"role\", \"content\"} objects");
  auto variables = from_json(request, "chat request", 0).object;
  for (const auto& [key, value] : special_tokens_)
    if (!variables->find(key)) variables->set(key, Value::string(value));
  if (!variables->find("add_generation_prompt"))
    variables->set("add_generation_prompt", Value::boolean(add_generation_prompt));
  return template_.render_variables(std::move(variables), limits, generation);
}

}  // namespace kiln::chat
