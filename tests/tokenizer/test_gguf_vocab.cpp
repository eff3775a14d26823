// GGUF vocabularies: the tokenizer.ggml.* keys written from each real
// tokenizer.json read back into a tokenizer with the same ids on every edge
// text; Llama-2's also without merges, from SentencePiece scores.
#include <fstream>
#include <map>

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
  // The names llama.cpp's converter gives these tokenizers.
  const std::map<std::string, std::string> pre = {{"llama3", "llama-bpe"},
                                                  {"qwen3", "qwen2"},
                                                  {"gpt2", "gpt-2"},
                                                  {"gpt4o", "gpt-4o"},
                                                  {"mistral_nemo", "tekken"}};
  if (pre.count(GetParam())) EXPECT_EQ(f.get("tokenizer.ggml.pre").as_string(), pre.at(GetParam()));
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

// `name`'s vocabulary written to GGUF with tokenizer.ggml.pre replaced by `pre`.
kiln::Tokenizer with_pre_name(const kiln::Tokenizer& tok, const std::string& pre,
                              const kiln_test::TempDir& dir) {
  kiln::GgufWriter w;
  tok.write_gguf_vocab(w);
  kiln::GgufWriter renamed;
  for (const auto& [key, value] : w.metadata())
    if (key != "tokenizer.ggml.pre") renamed.set(key, value);
  renamed.set("tokenizer.ggml.pre", pre);
  renamed.save(dir.file(pre + ".gguf"));
  return kiln::Tokenizer::from_gguf(kiln::GgufFile(dir.file(pre + ".gguf")));
}

// Names llama.cpp's converter writes for tokenizers that split as another name's.
TEST(GgufVocab, OtherNamesForTheSameSplit) {
  kiln_test::TempDir dir;
  kiln::Tokenizer qwen = kiln::Tokenizer::load(tokenizer_dir("qwen3"));
  expect_same_ids(qwen, with_pre_name(qwen, "deepseek-r1-qwen", dir), "deepseek-r1-qwen");
  kiln::Tokenizer llama3 = kiln::Tokenizer::load(tokenizer_dir("llama3"));
  expect_same_ids(llama3, with_pre_name(llama3, "smaug-bpe", dir), "smaug-bpe");
}

// SmolLM's tokenizer.json: GPT-2's byte-level BPE after a Digits step that makes
// each digit its own piece. llama.cpp names it "smollm"; kiln reads the name as
// those two steps and writes it back for a tokenizer that has them.
TEST(GgufVocab, SmollmSplitsDigitsBeforeByteLevel) {
  std::ifstream in(tokenizer_dir("gpt2") + "/tokenizer.json");
  auto parsed = nlohmann::json::parse(in);
  parsed["pre_tokenizer"] = nlohmann::json::parse(
      R"({"type":"Sequence","pretokenizers":[{"type":"Digits","individual_digits":true},)"
      R"({"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true}]})");
  kiln::Tokenizer smol = kiln::Tokenizer::from_json(parsed.dump());
  kiln::Tokenizer gpt2 = kiln::Tokenizer::load(tokenizer_dir("gpt2"));
  EXPECT_EQ(smol.encode("2026").size(), 4u);  // one piece per digit
  EXPECT_LT(gpt2.encode("2026").size(), 4u);

  kiln::GgufWriter w;
  smol.write_gguf_vocab(w);
  kiln_test::TempDir dir;
  w.save(dir.file("smol.gguf"));
  kiln::GgufFile f(dir.file("smol.gguf"));
  EXPECT_EQ(f.get("tokenizer.ggml.pre").as_string(), "smollm");
  expect_same_ids(smol, kiln::Tokenizer::from_gguf(f), "smollm");
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
