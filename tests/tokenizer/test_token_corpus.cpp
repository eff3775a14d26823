// load_token_corpus: SOTU addresses encoded once into the token cache and read
// back as a TokenDataset; its batches hold exactly the tokenizer's ids of the
// same text (u16 ids for GPT-2, u32 ids for Llama-3).
#include <filesystem>
#include <fstream>
#include <random>

#include "common/temp_dir.h"
#include "kiln/kiln.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

// The first `n` SOTU addresses as a corpus directory (same file names).
std::vector<std::string> sotu_head(const kiln_test::TempDir& dir, size_t n) {
  std::vector<std::string> docs = kiln_test::sotu_docs();
  EXPECT_GE(docs.size(), n) << "data/sotu is missing: run bash scripts/get-sotu.sh";
  docs.resize(std::min(n, docs.size()));
  std::filesystem::create_directory(dir.file("corpus"));
  for (size_t i = 0; i < docs.size(); ++i)  // a.txt, b.txt, ...: byte order is document order
    std::ofstream(dir.file("corpus/" + std::string(1, char('a' + i)) + ".txt"), std::ios::binary)
        << docs[i];
  return docs;
}

void check_windows(const std::string& name, int want_id_bytes) {
  SCOPED_TRACE(name);
  kiln_test::TempDir dir;
  const std::vector<std::string> docs = sotu_head(dir, 3);
  kiln::Tokenizer tok = kiln::Tokenizer::load(kiln_test::tokenizer_dir(name));
  std::vector<int32_t> want;  // each document's ids, then EOS
  for (const std::string& d : docs) {
    std::vector<int32_t> ids = tok.encode(d, false);
    want.insert(want.end(), ids.begin(), ids.end());
    want.push_back(*tok.eos_id());
  }
  const std::string cache = dir.file("corpus.tok");
  const kiln::TokenDataset built = kiln::load_token_corpus(tok, dir.file("corpus"), cache, 2);
  // Read back from the current cache (not re-encoded).
  EXPECT_FALSE(kiln::cached_corpus_tokens(tok, dir.file("corpus"), cache).rebuilt);
  const kiln::TokenDataset c = kiln::load_token_corpus(tok, dir.file("corpus"), cache);
  EXPECT_EQ(c.id_bytes(), want_id_bytes);
  EXPECT_EQ(c.vocab_size(), tok.vocab_size());
  ASSERT_EQ(c.size(), int64_t(want.size()));
  ASSERT_EQ(built.size(), c.size());

  // Every evaluation window of the validation range.
  const int64_t B = 4, T = 64;
  auto [train, val] = c.split(0.9);
  const int64_t val_begin = train.size();
  kiln::Context ctx;
  kiln::Tensor x = ctx.input(kiln::i32, {B, T}, "x"), y = ctx.input(kiln::i32, {B, T}, "y");
  kiln::CpuBackend cpu{1};
  auto buf = kiln::allocate_tensors(ctx, cpu);
  ASSERT_GT(val.n_batches(B, T), 0);
  for (int64_t b = 0; b < val.n_batches(B, T); ++b) {
    val.get_batch(x, y, b);
    const std::vector<int32_t> xs = x.get<int32_t>(), ys = y.get<int32_t>();
    for (int64_t r = 0; r < B; ++r) {
      const auto w = want.begin() + val_begin + (b * B + r) * (T + 1);
      ASSERT_EQ(std::vector<int32_t>(xs.begin() + r * T, xs.begin() + (r + 1) * T),
                std::vector<int32_t>(w, w + T));
      ASSERT_EQ(std::vector<int32_t>(ys.begin() + r * T, ys.begin() + (r + 1) * T),
                std::vector<int32_t>(w + 1, w + T + 1));
    }
  }
  // Random training windows.
  std::mt19937_64 rng(11), offsets(11);
  train.sample_batch(x, y, rng);
  const std::vector<int32_t> xs = x.get<int32_t>();
  for (int64_t r = 0; r < B; ++r) {
    const auto w = want.begin() + train.random_offset(offsets, T);
    EXPECT_EQ(std::vector<int32_t>(xs.begin() + r * T, xs.begin() + (r + 1) * T),
              std::vector<int32_t>(w, w + T));
  }
}

TEST(TokenCorpus, WindowsEqualTheTokenizersIdsGpt2U16) { check_windows("gpt2", 2); }
TEST(TokenCorpus, WindowsEqualTheTokenizersIdsLlama3U32) { check_windows("llama3", 4); }

}  // namespace
