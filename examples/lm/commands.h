// kiln-lm's subcommands: each file adds one to the command line and returns
// what runs it, so main.cpp stays a dispatcher.
#pragma once
#include <CLI/CLI.hpp>
#include <functional>

namespace lm {

struct Command {
  CLI::App* app = nullptr;   // the subcommand, for parsed()
  std::function<int()> run;  // exit status: 0 ok, 1 kiln::Error (on stderr)
};

Command add_tokenize(CLI::App& app);        // tokenize.cpp
Command add_generate(CLI::App& app);        // generate.cpp
Command add_perplexity(CLI::App& app);      // perplexity.cpp
Command add_pretrain(CLI::App& app);        // pretrain.cpp
Command add_finetune(CLI::App& app);        // finetune.cpp
Command add_quantize(CLI::App& app);        // quantize.cpp
Command add_template(CLI::App& app);        // template.cpp
Command add_chat(CLI::App& app);            // chat.cpp
Command add_export_adapter(CLI::App& app);  // export_adapter.cpp
Command add_add_tokens(CLI::App& app);      // add_tokens.cpp
Command add_cmudict_chat(CLI::App& app);    // cmudict_chat.cpp
Command add_eval_chat(CLI::App& app);       // eval_chat.cpp
#if KILN_LM_HAVE_HTTPLIB
Command add_serve(CLI::App& app);  // serve.cpp (needs cpp-httplib)
#endif

}  // namespace lm
