// kiln-lm add-tokens: gives a base model new special tokens and, optionally,
// a chat template, as a PyTorch user does before instruction-tuning it:
//   tokenizer.add_special_tokens({"additional_special_tokens": [...]})
//   model.resize_token_embeddings(len(tokenizer))
//   tokenizer.chat_template = ...; model.save_pretrained(out); tokenizer.save_pretrained(out)
// Writes a new Hugging Face directory: the resized model (new embedding rows,
// and an untied head's, the mean of the old rows), tokenizer.json with the
// tokens in added_tokens (special: matched before normalization, never split),
// and tokenizer_config.json with them in added_tokens_decoder and
// additional_special_tokens and the chat template. The new rows must then be
// trained: kiln-lm finetune --full (docs/chat.md, "Giving a base model a chat
// template").
//   kiln-lm add-tokens --model DIR --out DIR [--chat-template chatml|FILE.jinja]
//                      [--special-tokens "<|im_start|>,<|im_end|>"] [--threads N]
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/chat.h"
#include "kiln/error.h"
#include "kiln/models.h"
#include "kiln/tokenizer.h"
#include "lm_model.h"

namespace lm {
namespace {

namespace fs = std::filesystem;
constexpr const char* kAddTokensCmd = "kiln-lm add-tokens";

struct AddTokensOptions {
  std::string model, out, chat_template, special_tokens;
  int threads = 0;
};

std::vector<std::string> comma_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

void write_file(const fs::path& path, const std::string& text) {
  const fs::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) kiln::fail(kAddTokensCmd, "cannot write ", tmp.string());
  }
  fs::rename(tmp, path);
}

int run_add_tokens(const AddTokensOptions& o) {
  using Json = nlohmann::ordered_json;
  if (!fs::is_directory(o.model) || !fs::exists(fs::path(o.model) / "tokenizer.json"))
    kiln::fail(kAddTokensCmd, "--model ", o.model,
               " must be a Hugging Face model directory with tokenizer.json");
  if (fs::exists(o.out) && fs::equivalent(o.out, o.model))
    kiln::fail(kAddTokensCmd, "--out must be another directory than --model");
  std::string tmpl;
  std::vector<std::string> tokens = comma_list(o.special_tokens);
  if (o.chat_template == "chatml") {
    tmpl = kiln::chat::chatml_template();
    if (o.special_tokens.empty())
      tokens = {std::string(kiln::chat::kChatmlStart), std::string(kiln::chat::kChatmlEnd)};
  } else if (!o.chat_template.empty()) {
    tmpl = read_text(o.chat_template, kAddTokensCmd);
  }
  if (tokens.empty() && tmpl.empty())
    kiln::fail(kAddTokensCmd, "nothing to do: give --special-tokens and/or --chat-template");

  const fs::path dir(o.model);
  const std::string tok_json =
      kiln::add_special_tokens_json(read_text((dir / "tokenizer.json").string(), kAddTokensCmd),
                                    tokens, (dir / "tokenizer.json").string());
  Json config = Json::object();
  if (fs::exists(dir / "tokenizer_config.json")) {
    try {
      config = Json::parse(read_text((dir / "tokenizer_config.json").string(), kAddTokensCmd));
    } catch (const Json::exception& e) {
      kiln::fail(kAddTokensCmd, (dir / "tokenizer_config.json").string(), ": ", e.what());
    }
  }
  // Where transformers' save_pretrained lists added tokens: by id, and by name.
  const Json added = Json::parse(tok_json)["added_tokens"];
  Json& decoder = config["added_tokens_decoder"];
  if (!decoder.is_object()) decoder = Json::object();
  Json& extra = config["additional_special_tokens"];
  if (!extra.is_array()) extra = Json::array();
  for (const std::string& t : tokens)
    for (const Json& a : added)
      if (a["content"] == t) {
        Json entry = a;
        entry.erase("id");
        decoder[std::to_string(a["id"].get<int64_t>())] = entry;
        if (std::find(extra.begin(), extra.end(), Json(t)) == extra.end()) extra.push_back(t);
      }
  if (!tmpl.empty()) config["chat_template"] = tmpl;
  const std::string config_text = config.dump(2);
  // Load what will be written, so a token or template kiln cannot read fails here.
  const kiln::Tokenizer tok = kiln::Tokenizer::from_json(tok_json, config_text, o.out);
  if (!tmpl.empty())
    (void)kiln::chat::ChatTemplate::from_config(config_text, {}, "", "--chat-template");

  kiln::Context ctx;
  kiln::CpuBackend cpu(o.threads);
  std::unique_ptr<kiln::models::CausalLM> base = kiln::models::load_pretrained(ctx, cpu, o.model);
  const int64_t old_vocab = base->vocab_size();
  // Never smaller: rows past the tokenizer (padding to a round size) stay.
  const int64_t vocab = std::max(old_vocab, tok.vocab_size());
  kiln::Context out_ctx;
  std::unique_ptr<kiln::models::CausalLM> model =
      kiln::models::resize_token_embeddings(out_ctx, cpu, *base, vocab);
  kiln::models::save_pretrained(*model, o.out);
  write_file(fs::path(o.out) / "tokenizer.json", tok_json);
  write_file(fs::path(o.out) / "tokenizer_config.json", config_text);
  std::printf("%s: %s -> %s: vocab %lld -> %lld;", kAddTokensCmd, o.model.c_str(), o.out.c_str(),
              (long long)old_vocab, (long long)vocab);
  for (const std::string& t : tokens)
    std::printf(" %s=%d", t.c_str(), int(tok.token_to_id(t).value_or(-1)));
  std::printf("%s\n", tmpl.empty() ? "" : "; chat template set");
  return 0;
}

}  // namespace

Command add_add_tokens(CLI::App& app) {
  auto o = std::make_shared<AddTokensOptions>();
  CLI::App* c = app.add_subcommand(
      "add-tokens",
      "add special tokens (new embedding rows) and a chat template to a model directory");
  c->add_option("--model", o->model, "a Hugging Face model directory with tokenizer.json")
      ->required();
  c->add_option("--out", o->out, "the new model directory")->required();
  c->add_option("--chat-template", o->chat_template,
                "chatml (adds <|im_start|> and <|im_end|> unless --special-tokens says "
                "otherwise), or a Jinja file");
  c->add_option("--special-tokens", o->special_tokens,
                "comma-separated tokens to add as special tokens");
  c->add_option("--threads", o->threads, "CPU threads (0: all)")->capture_default_str();
  return {c, [o] { return run_add_tokens(*o); }};
}

}  // namespace lm
