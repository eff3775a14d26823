// New special tokens in a tokenizer.json (kiln::add_special_tokens_json, what
// kiln-lm add-tokens writes): the next ids, matched in text before anything
// else, dropped by skip_special_tokens; and on the Llama-2 tokenizer (a base
// model's, no chat template) with ChatML, the conversation of the README chat
// job trains exactly the reply and its <|im_end|>.
#include "common/error_check.h"
#include "kiln/kiln.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

const char* kTinyAddTokensJson =
    R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "<unk>": 4},
       "merges": ["a b"], "unk_token": "<unk>"},
       "added_tokens": [{"id": 4, "content": "<unk>", "special": true}]})";

TEST(AddSpecialTokens, NewTokensGetTheNextIdsAndAreMatchedWhole) {
  const std::vector<std::string> add = {"<|im_start|>", "<|im_end|>", "ab", "<unk>"};
  const std::string json = kiln::add_special_tokens_json(kTinyAddTokensJson, add);
  const kiln::Tokenizer t = kiln::Tokenizer::from_json(json);
  EXPECT_EQ(t.vocab_size(), 7);  // "ab" and "<unk>" were there already
  EXPECT_EQ(t.token_to_id("<|im_start|>"), 5);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 6);
  EXPECT_TRUE(t.is_special(5));
  EXPECT_TRUE(t.is_special(6));
  EXPECT_FALSE(t.is_special(2));
  // Never split, also next to text: without the tokens "<|...|>" would be <unk>s.
  const std::vector<int32_t> ids = t.encode("<|im_start|>abc<|im_end|>ab");
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 2, 3, 6, 2}));
  EXPECT_EQ(t.decode(ids), "<|im_start|>abc<|im_end|>ab");
  EXPECT_EQ(t.decode(ids, /*skip_special_tokens=*/true), "abcab");
  // Adding them again changes nothing.
  EXPECT_EQ(kiln::add_special_tokens_json(json, add), json);
  // A file without added_tokens gets the list.
  const std::string bare = kiln::add_special_tokens_json(
      R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}})",
      std::vector<std::string>{"<s>"});
  EXPECT_EQ(kiln::Tokenizer::from_json(bare).token_to_id("<s>"), 2);
}

TEST(AddSpecialTokens, BadInputIsNamed) {
  const std::vector<std::string> one = {"<x>"};
  EXPECT_KILN_ERROR(kiln::add_special_tokens_json("{", one, "t.json"), "tokenizer", "t.json",
                    "not valid JSON");
  EXPECT_KILN_ERROR(kiln::add_special_tokens_json(R"({"x": 1})", one, "t.json"), "tokenizer",
                    "no \"model\"");
  EXPECT_KILN_ERROR(kiln::add_special_tokens_json(kTinyAddTokensJson, std::vector<std::string>{""}),
                    "tokenizer", "may not be empty");
}

TEST(AddSpecialTokens, Llama2WithChatmlTrainsTheReplyAndItsEnd) {
  const std::string dir = kiln_test::tokenizer_dir("llama2");
  const std::vector<std::string> markers = {std::string(kiln::chat::kChatmlStart),
                                            std::string(kiln::chat::kChatmlEnd)};
  const kiln::Tokenizer tok = kiln::Tokenizer::from_json(
      kiln::add_special_tokens_json(kiln_test::read_bytes(dir + "/tokenizer.json"), markers),
      kiln_test::read_bytes(dir + "/tokenizer_config.json"));
  ASSERT_EQ(tok.vocab_size(), 32002);
  EXPECT_EQ(tok.token_to_id("<|im_start|>"), 32000);
  EXPECT_EQ(tok.token_to_id("<|im_end|>"), 32001);
  nlohmann::json config = nlohmann::json::object();
  config["chat_template"] = std::string(kiln::chat::chatml_template());
  const kiln::chat::ChatTemplate tmpl = kiln::chat::ChatTemplate::from_config(config.dump());
  const std::string line =
      R"({"messages": [{"role": "user", "content": "How do you pronounce 'ADDISON'?"},)"
      R"( {"role": "assistant", "content": "AE1 D IH0 S AH0 N"}]})";
  EXPECT_EQ(tmpl.apply(line, false),
            "<|im_start|>user\nHow do you pronounce 'ADDISON'?<|im_end|>\n"
            "<|im_start|>assistant\nAE1 D IH0 S AH0 N<|im_end|>\n");
  const kiln::ChatExample e =
      kiln::tokenize_chat_example(line, tok, &tmpl, kiln::TrainOn::assistant, "cmudict.jsonl:1");
  EXPECT_EQ(e.ids.front(), 32000);
  std::vector<int32_t> trained;
  for (size_t k = 0; k < e.ids.size(); ++k)
    if (e.trained[k]) trained.push_back(e.ids[k]);
  ASSERT_FALSE(trained.empty());
  // The reply, then <|im_end|> (the token that ends a reply) and the newline after it.
  const std::string text = tok.decode(trained);
  EXPECT_EQ(text.substr(0, text.find("<|im_end|>")).find("AE1 D IH0 S AH0 N"), 0u) << text;
  EXPECT_NE(std::find(trained.begin(), trained.end(), 32001), trained.end());
  EXPECT_EQ(std::count(e.ids.begin(), e.ids.end(), 32001), 2);
  EXPECT_EQ(std::count(trained.begin(), trained.end(), 32000), 0);  // no prompt marker trained
}

}  // namespace
