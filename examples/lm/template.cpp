// kiln-lm template: renders a conversation with a model's chat template and
// prints the prompt, nothing else (no newline added), so it can be piped or
// compared byte for byte.
//   kiln-lm template --tokenizer DIR|MODEL.gguf --messages FILE.json [--add-generation-prompt]
//                    [--template NAME]
// FILE.json is {"messages": [...], "tools": [...], ...more variables}.
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "commands.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/io.h"

namespace lm {
namespace {

struct TemplateOptions {
  std::string tokenizer, messages, name;
  bool add_generation_prompt = false;
};

int run(const TemplateOptions& o) {
  std::ifstream in(o.messages, std::ios::binary);
  if (!in) kiln::fail("kiln-lm template", "cannot read --messages ", o.messages);
  std::stringstream request;
  request << in.rdbuf();
  const bool gguf =
      o.tokenizer.size() > 5 && o.tokenizer.compare(o.tokenizer.size() - 5, 5, ".gguf") == 0;
  const kiln::chat::ChatTemplate t =
      gguf ? kiln::chat::ChatTemplate::from_gguf(kiln::GgufFile(o.tokenizer), o.name)
           : kiln::chat::ChatTemplate::load(o.tokenizer, o.name);
  const std::string prompt = t.apply(request.str(), o.add_generation_prompt);
  std::fwrite(prompt.data(), 1, prompt.size(), stdout);
  return std::fflush(stdout) == 0 ? 0 : 1;
}

}  // namespace

Command add_template(CLI::App& app) {
  auto o = std::make_shared<TemplateOptions>();
  CLI::App* s =
      app.add_subcommand("template", "print a conversation rendered with the chat template");
  s->add_option("--tokenizer", o->tokenizer,
                "directory with tokenizer_config.json (chat_template) or chat_template.jinja, "
                "or a .gguf file (tokenizer.chat_template)")
      ->required();
  s->add_option("--messages", o->messages,
                "JSON file: {\"messages\": [...], \"tools\": [...], ...extra variables}")
      ->required();
  s->add_flag("--add-generation-prompt", o->add_generation_prompt,
              "end with the start of the assistant's turn");
  s->add_option("--template", o->name, "which of a list of named templates (default: \"default\")");
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
