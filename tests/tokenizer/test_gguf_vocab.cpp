// GGUF vocabularies: the tokenizer.ggml.* keys written from each real
// tokenizer.json read back into a tokenizer with the same ids on every edge
// text; Llama-2's also without merges, from SentencePiece scores.
#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/io.h"
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln_test::tokenizer_dir;

void expect_same_ids(const kiln::Tokenizer& a, const kiln::Tokenizer& b, const std::string& what) {
  auto exp = kiln_test::expected("gpt2");  // only the list of texts
  for (auto& [file, unused] : exp["texts"].items()) {
    std::string t = kiln_test::text(file);
    EXPECT_EQ(a.encode(t, true), b.encode(t, true)) << what << " " << file;
    EXPECT_EQ(a.encode(t, false), b.encode(t, false)) << what << " " << file;
  }
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
}

class GgufVocab : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufVocab, RoundTripKeepsTheIds) {
  kiln::Tokenizer json = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  kiln_test::TempDir dir;
  kiln::GgufWriter w;
  json.write_gguf_vocab(w);
  w.save(dir.file("vocab.gguf"));
  kiln::GgufFile f(dir.file("vocab.gguf"));
  EXPECT_EQ(f.get("tokenizer.ggml.model").as_string(), GetParam() == "llama2" ? "llama" : "gpt2");
  kiln::Tokenizer gguf = kiln::Tokenizer::from_gguf(f);
  expect_same_ids(json, gguf, GetParam());
  std::vector<int32_t> ids = json.encode(kiln_test::text("scripts.txt"));
  EXPECT_EQ(gguf.decode(ids), json.decode(ids));
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, GgufVocab, ::testing::ValuesIn(kiln_test::tokenizer_names()),
                         [](const auto& info) { return info.param; });

TEST(GgufVocab, LlamaMergesFromScores) {
  kiln::Tokenizer json = kiln::Tokenizer::load(tokenizer_dir("llama2"));
  kiln::GgufWriter w;
  json.write_gguf_vocab(w);
  kiln::GgufWriter without;  // what llama.cpp writes for SentencePiece models: no merges
  for (const auto& [key, value] : w.metadata())
    if (key != "tokenizer.ggml.merges") without.set(key, value);
  kiln_test::TempDir dir;
  without.save(dir.file("spm.gguf"));
  kiln::Tokenizer gguf = kiln::Tokenizer::from_gguf(kiln::GgufFile(dir.file("spm.gguf")));
  expect_same_ids(json, gguf, "llama2 from scores");
}

TEST(GgufVocab, RefusesWhatItCannotRead) {
  kiln_test::TempDir dir;
  kiln::GgufWriter w;
  w.set("tokenizer.ggml.model", "bert");
  w.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  w.save(dir.file("bert.gguf"));
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_gguf(kiln::GgufFile(dir.file("bert.gguf"))), "tokenizer",
                    "tokenizer.ggml.model 'bert'");
  kiln::GgufWriter p;
  p.set("tokenizer.ggml.model", "gpt2");
  p.set("tokenizer.ggml.pre", "falcon");
  p.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  p.set("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  p.save(dir.file("pre.gguf"));
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_gguf(kiln::GgufFile(dir.file("pre.gguf"))), "tokenizer",
                    "tokenizer.ggml.pre 'falcon'");
  kiln::GgufWriter b;
  b.set("tokenizer.ggml.model", "gpt2");
  b.set("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  b.set("tokenizer.ggml.merges", std::vector<std::string>{"a b"});
  b.set("tokenizer.ggml.bos_token_id", uint32_t(7));
  b.save(dir.file("bos.gguf"));
  EXPECT_KILN_ERROR(kiln::Tokenizer::from_gguf(kiln::GgufFile(dir.file("bos.gguf"))), "tokenizer",
                    "bos_token_id = 7");
}

}  // namespace
