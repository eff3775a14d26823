// kiln::chat: chat templates, the Jinja text in a model's tokenizer_config.json
// (`chat_template`) or chat_template.jinja that turns a conversation into the
// prompt the model was trained on. The renderer implements the part of Jinja
// that Hugging Face chat templates use, rendered as transformers renders them
// (trim_blocks and lstrip_blocks on, tojson as json.dumps). A construct it does
// not support is a kiln::Error naming it and its line, never a different prompt;
// limits on steps, call depth and output size stop hostile templates.
//
//   kiln::chat::ChatTemplate t = kiln::chat::ChatTemplate::load("data/models/qwen3");
//   std::string prompt = t.apply(R"({"messages": [{"role": "user", "content": "Hi"}]})",
//                                /*add_generation_prompt=*/true);
//
//   kiln::chat::Template j("{% for m in messages %}{{ m.content }}{% endfor %}");
//   j.render(R"({"messages": [{"content": "a"}]})");  // "a"
//
// docs/chat.md lists what is supported and where kiln differs from Python Jinja.
#pragma once
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {
class GgufFile;
}

namespace kiln::chat {

struct Program;  // a parsed template (src/chat)
struct Object;   // the variables of one render (src/chat)

// What one render may spend. A template that exceeds a limit stops with a
// kiln::Error naming the limit and the template line it was at.
struct Limits {
  uint64_t max_steps = 10'000'000;  // statements and expressions evaluated
  int max_depth = 200;              // nested macro calls
  size_t max_output = 64ull << 20;  // bytes of output (and of any string or list built)
  // Clock of strftime_now(); default: the system clock. Tests fix it.
  std::function<std::time_t()> now;
};

class Template {
 public:
  // Parses `source`; a syntax error or an unsupported tag is a kiln::Error with
  // the line. `name` names the template in error messages.
  explicit Template(std::string_view source, std::string name = "chat template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with the members of `variables_json` (a JSON object) as variables.
  std::string render(std::string_view variables_json, const Limits& limits = {}) const;

  const std::string& name() const { return name_; }
  // Whether the template marks the assistant's text with {% generation %}
  // blocks (transformers' return_assistant_tokens_mask reads them).
  bool has_generation_blocks() const;

 private:
  friend class ChatTemplate;
  std::string render_variables(std::shared_ptr<Object> variables, const Limits& limits,
                               std::vector<std::pair<size_t, size_t>>* generation = nullptr) const;
  std::string name_;
  std::shared_ptr<const Program> program_;
};

// A render and the byte ranges [begin, end) of its text that {% generation %}
// blocks wrote, in order (empty when the template has none).
struct MarkedText {
  std::string text;
  std::vector<std::pair<size_t, size_t>> generation;
};

// A model's chat template with the special tokens transformers passes to it.
class ChatTemplate {
 public:
  // From a model or tokenizer directory: tokenizer_config.json's chat_template
  // (a string, or a list of {"name", "template"}: `template_name`, default
  // "default") or else chat_template.jinja; special tokens from
  // tokenizer_config.json (strings or {"content": ...} objects).
  static ChatTemplate load(const std::string& dir, const std::string& template_name = "");
  // The same from texts: tokenizer_config.json (may be empty) and
  // chat_template.jinja (may be empty). `what` names the source in errors.
  static ChatTemplate from_config(std::string_view tokenizer_config_json,
                                  std::string_view template_jinja = {},
                                  const std::string& template_name = "",
                                  const std::string& what = "tokenizer_config.json");

  // From a GGUF file's metadata as llama.cpp writes it: tokenizer.chat_template
  // (or tokenizer.chat_template.<name>), special tokens from
  // tokenizer.ggml.{bos,eos,unknown,padding}_token_id and tokenizer.ggml.tokens.
  static ChatTemplate from_gguf(const GgufFile& file, const std::string& template_name = "");

  // `request_json` is {"messages": [...], "tools": [...], ...more variables such
  // as enable_thinking}; the special tokens (bos_token, eos_token, ...) and
  // add_generation_prompt are added unless the request sets them.
  std::string apply(std::string_view request_json, bool add_generation_prompt,
                    const Limits& limits = {}) const;
  // apply() with the ranges of the text {% generation %} blocks wrote: what
  // chat fine-tuning trains on when the template has such blocks.
  MarkedText apply_marked(std::string_view request_json, bool add_generation_prompt,
                          const Limits& limits = {}) const;

  const Template& jinja() const { return template_; }
  // bos_token, eos_token, unk_token, pad_token, ...: those the config names.
  const std::map<std::string, std::string>& special_tokens() const { return special_tokens_; }

 private:
  ChatTemplate(Template t, std::map<std::string, std::string> special)
      : template_(std::move(t)), special_tokens_(std::move(special)) {}
  std::string render_request(std::string_view request_json, bool add_generation_prompt,
                             const Limits& limits,
                             std::vector<std::pair<size_t, size_t>>* generation) const;
  Template template_;
  std::map<std::string, std::string> special_tokens_;
};

// ChatML, the chat markup of OpenAI's early chat models that Qwen, SmolLM2's
// instruct models and many fine-tunes of base models use: each message as
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n", the generation prompt
// "<|im_start|>assistant\n". The template to give a base model that has none
// (kiln-lm add-tokens --chat-template chatml), with its two markers added to
// the tokenizer as special tokens (kChatmlStart, kChatmlEnd).
std::string_view chatml_template();
inline constexpr std::string_view kChatmlStart = "<|im_start|>", kChatmlEnd = "<|im_end|>";

}  // namespace kiln::chat
