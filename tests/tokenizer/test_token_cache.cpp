// The token cache: a corpus encoded once, read back while it is current,
// rebuilt when the corpus or the tokenizer changes; u16 ids for small vocabularies.
#include <filesystem>
#include <fstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln_test::tokenizer_dir;

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

TEST(TokenCache, EncodesOnceThenReads) {
  kiln_test::TempDir dir;
  std::filesystem::create_directory(dir.file("corpus"));
  write(dir.file("corpus/b.txt"), kiln_test::text("english.txt"));
  write(dir.file("corpus/a.txt"), kiln_test::text("scripts.txt"));
  kiln::Tokenizer gpt2 = kiln::Tokenizer::load(tokenizer_dir("gpt2"));
  std::string cache = dir.file("corpus.tok");

  kiln::TokenCache first = kiln::cached_corpus_tokens(gpt2, dir.file("corpus"), cache, 2);
  EXPECT_TRUE(first.rebuilt);
  // a.txt first (byte order of names), each followed by EOS.
  std::vector<uint32_t> want;
  for (const char* f : {"scripts.txt", "english.txt"}) {
    for (int32_t id : gpt2.encode(kiln_test::text(f), false)) want.push_back(uint32_t(id));
    want.push_back(uint32_t(*gpt2.eos_id()));
  }
  EXPECT_EQ(first.ids, want);
  EXPECT_EQ(std::filesystem::file_size(cache),
            48 + 2 * want.size());  // u16 ids: GPT-2 has 50257 tokens

  kiln::TokenCache again = kiln::cached_corpus_tokens(gpt2, dir.file("corpus"), cache);
  EXPECT_FALSE(again.rebuilt);
  EXPECT_EQ(again.ids, want);

  write(dir.file("corpus/c.txt"), "one more document");  // another corpus: rebuilt
  EXPECT_TRUE(kiln::cached_corpus_tokens(gpt2, dir.file("corpus"), cache).rebuilt);
  kiln::Tokenizer llama3 =
      kiln::Tokenizer::load(tokenizer_dir("llama3"));  // another tokenizer: rebuilt, u32
  kiln::TokenCache l3 = kiln::cached_corpus_tokens(llama3, dir.file("corpus"), cache);
  EXPECT_TRUE(l3.rebuilt);
  EXPECT_EQ(std::filesystem::file_size(cache), 48 + 4 * l3.ids.size());
  EXPECT_FALSE(kiln::cached_corpus_tokens(llama3, dir.file("corpus"), cache).rebuilt);
}

TEST(TokenCache, EmptyCorpusIsAnError) {
  kiln_test::TempDir dir;
  kiln::Tokenizer gpt2 = kiln::Tokenizer::load(tokenizer_dir("gpt2"));
  EXPECT_KILN_ERROR(kiln::cached_corpus_tokens(gpt2, dir.file("none"), dir.file("x.tok")),
                    "token cache", "no *.txt files");
}

}  // namespace
