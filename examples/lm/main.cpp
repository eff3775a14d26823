// kiln-lm: language-model tools on kiln. Subcommands (one file each):
//   kiln-lm tokenize --tokenizer FILE|DIR --text FILE|DIR [--ids] [--threads N]
//   kiln-lm generate --model DIR|FILE.gguf --prompt TEXT|--prompt-ids 1,2,3 [--max-tokens N]
//                    [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--repeat-penalty R]
//                    [--presence-penalty P] [--frequency-penalty F] [--logit-bias ID=B]
//                    [--stop TEXT] [--seed S] [--print-ids] [--no-echo]
//   kiln-lm perplexity --model DIR|FILE.gguf --text FILE|--ids FILE [--ctx N] [--kl-base MODEL]
//   kiln-lm pretrain [--tokenizer DIR --data DIR --out DIR --iters N ...]
//   kiln-lm finetune --model DIR --data FILE|DIR --out DIR|FILE.gguf [--full] [--lora-r 8] ...
//   kiln-lm export-adapter IN OUT --model BASE (PEFT directory <-> GGUF adapter file)
//   kiln-lm add-tokens --model DIR --out DIR [--chat-template chatml|FILE] [--special-tokens ...]
//   kiln-lm cmudict-chat --dict dict.txt --train train.jsonl --held held.jsonl
//   kiln-lm eval-chat --model DIR|FILE.gguf --data held.jsonl [--limit N] (exact match, PER)
//   kiln-lm quantize IN OUT.gguf --type q4_k_m|q6_k|q8_0|...|f32 [--pure] (llama.cpp's recipes)
//   kiln-lm template --tokenizer DIR --messages FILE.json [--add-generation-prompt]
//   kiln-lm chat --model DIR|FILE.gguf [--system TEXT] [--max-tokens N] [sampling options]
//   kiln-lm serve --model DIR|FILE.gguf [--host 127.0.0.1] [--port 8080] [--parallel 4]
//                 (built where cpp-httplib is installed: libcpp-httplib-dev)
// Exit status: 0 on success, 1 on a kiln::Error (message on stderr), 2 on a bad
// command line.
#include <cstdio>
#include <vector>

#include "commands.h"
#include "kiln/error.h"

int main(int argc, char** argv) {
  CLI::App app{"kiln-lm: language-model tools (docs/tokenizer.md, docs/models.md)"};
  app.require_subcommand(1);
  std::vector<lm::Command> commands = {
      lm::add_tokenize(app),   lm::add_generate(app),     lm::add_perplexity(app),
      lm::add_pretrain(app),   lm::add_finetune(app),     lm::add_quantize(app),
      lm::add_template(app),   lm::add_chat(app),         lm::add_export_adapter(app),
      lm::add_add_tokens(app), lm::add_cmudict_chat(app), lm::add_eval_chat(app)};
#if KILN_LM_HAVE_HTTPLIB
  commands.push_back(lm::add_serve(app));
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    for (const lm::Command& c : commands)
      if (c.app->parsed()) return c.run();
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln-lm: %s\n", e.what());
    return 1;
  }
  return 2;
}
