// decode(encode(x)) == x where the tokenizer is lossless, streaming decode
// equals a full decode, and the id/token lookups.
#include <set>

#include "common/error_check.h"
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln_test::tokenizer_dir;

// Texts a tokenizer cannot give back unchanged: Qwen3 normalizes to NFC, and
// Llama-2's normalizer puts a space before the text after each special token.
bool lossless(const std::string& name, const std::string& file) {
  if (name == "qwen3" && file == "combining.txt") return false;
  if (name == "llama2" && file == "special.txt") return false;
  return true;
}

class Decode : public ::testing::TestWithParam<std::string> {};

TEST_P(Decode, RoundTripsEveryLosslessText) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  int checked = 0;
  auto exp = kiln_test::expected(GetParam());
  for (auto& [file, unused] : exp["texts"].items()) {
    if (!lossless(GetParam(), file)) continue;
    std::string t = kiln_test::text(file);
    if (file == "invalid_utf8.txt") {
      // Invalid bytes come back as U+FFFD, one per maximal invalid subpart.
      t = "ok \xEF\xBF\xBD lone, \xEF\xBF\xBD truncated, \xEF\xBF\xBD\xEF\xBF\xBD overlong, "
          "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD surrogate, \xEF\xBF\xBD\xEF\xBF\xBD never, "
          "\xEF\xBF\xBD end\xEF\xBF\xBD";
    }
    EXPECT_EQ(tok.decode(tok.encode(kiln_test::text(file), false)), t) << GetParam() << " " << file;
    ++checked;
  }
  EXPECT_GE(checked, 10);
}

TEST_P(Decode, StreamingEqualsFullDecode) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  for (const char* file :
       {"emoji.txt", "scripts.txt", "whitespace.txt", "combining.txt", "special.txt"}) {
    std::vector<int32_t> ids = tok.encode(kiln_test::text(file), true);
    kiln::StreamDecoder stream(tok);
    std::string out;
    size_t held = 0;  // pushes that returned nothing: a character waits for its bytes
    for (int32_t id : ids) {
      std::string piece = stream.push(id);
      // What comes out is always whole UTF-8 characters.
      EXPECT_EQ(piece.find("\xEF\xBF\xBD"), std::string::npos) << GetParam() << " " << file;
      held += piece.empty();
      out += piece;
    }
    out += stream.flush();
    EXPECT_EQ(out, tok.decode(ids)) << GetParam() << " " << file;
    if (std::string(file) == "emoji.txt") EXPECT_GT(held, 0u) << "no emoji was split over tokens";
  }
}

TEST_P(Decode, SkipsSpecialTokens) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  std::vector<int32_t> ids = tok.encode(kiln_test::text("special.txt"), true);
  std::string all = tok.decode(ids), plain = tok.decode(ids, true);
  EXPECT_LT(plain.size(), all.size());
  for (int32_t id : ids)
    if (tok.is_special(id))
      EXPECT_EQ(plain.find(tok.id_to_token(id)), std::string::npos) << tok.id_to_token(id);
}

TEST_P(Decode, LookupsAgree) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  for (int32_t id : {0, 1, 100, 1000, int32_t(tok.vocab_size() - 1)}) {
    const std::string& t = tok.id_to_token(id);
    ASSERT_TRUE(tok.token_to_id(t)) << t;
    EXPECT_EQ(*tok.token_to_id(t), id);
  }
  EXPECT_FALSE(tok.token_to_id("surely-not-a-token-\x01"));
  EXPECT_KILN_ERROR(tok.id_to_token(int32_t(tok.vocab_size())), "tokenizer",
                    "outside the vocabulary");
  EXPECT_KILN_ERROR(tok.decode(std::vector<int32_t>{-1}), "tokenizer", "id -1");
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, Decode, ::testing::ValuesIn(kiln_test::tokenizer_names()),
                         [](const auto& info) { return info.param; });

TEST(TokenizerIds, SpecialIdsOfEachModel) {
  kiln::Tokenizer l3 = kiln::Tokenizer::load(tokenizer_dir("llama3"));
  EXPECT_EQ(l3.vocab_size(), 128256);
  EXPECT_EQ(l3.bos_id(), 128000);
  EXPECT_EQ(l3.eos_id(), 128001);
  EXPECT_TRUE(l3.is_special(128000));
  EXPECT_FALSE(l3.is_special(9906));
  kiln::Tokenizer l2 = kiln::Tokenizer::load(tokenizer_dir("llama2"));
  EXPECT_EQ(l2.vocab_size(), 32000);
  EXPECT_EQ(l2.bos_id(), 1);
  EXPECT_EQ(l2.eos_id(), 2);
  EXPECT_EQ(l2.unk_id(), 0);
  // Llama-2's template adds BOS; the ids after it are those without.
  std::vector<int32_t> with = l2.encode("Hello", true), without = l2.encode("Hello", false);
  ASSERT_EQ(with.size(), without.size() + 1);
  EXPECT_EQ(with[0], 1);
  kiln::Tokenizer q = kiln::Tokenizer::load(tokenizer_dir("qwen3"));
  EXPECT_EQ(q.eos_id(), *q.token_to_id("<|im_end|>"));
  EXPECT_FALSE(q.bos_id());
  EXPECT_FALSE(q.is_special(*q.token_to_id("<think>")));  // added, not special
}

TEST(TokenizerIds, BatchEqualsOneByOne) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir("llama3"));
  std::vector<std::string> texts;
  auto exp = kiln_test::expected("llama3");  // items() must not outlive it
  for (auto& [file, unused] : exp["texts"].items()) texts.push_back(kiln_test::text(file));
  for (int threads : {1, 3}) {
    auto batch = tok.encode_batch(texts, true, threads);
    ASSERT_EQ(batch.size(), texts.size());
    for (size_t k = 0; k < texts.size(); ++k) EXPECT_EQ(batch[k], tok.encode(texts[k], true));
  }
}

}  // namespace
