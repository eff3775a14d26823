// kiln's ids equal the reference implementation's (tests/tokenizer/expected,
// made by make_reference.mjs) on every edge-case text and on the whole SOTU
// corpus, for the Llama-3, Qwen3, Llama-2 and GPT-2 tokenizers.
#include <chrono>
#include <cstdio>

#include "kiln/tokenizer.h"
#include "tokenizer/tokenizer_test_util.h"

namespace {

using kiln_test::expected;
using kiln_test::tokenizer_dir;

class ReferenceIds : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceIds, EdgeTexts) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  auto exp = expected(GetParam());
  ASSERT_FALSE(exp["texts"].empty());
  for (auto& [file, ids] : exp["texts"].items()) {
    std::string t = kiln_test::text(file);
    EXPECT_EQ(tok.encode(t, false), ids["ids"].get<std::vector<int32_t>>())
        << GetParam() << " " << file;
    EXPECT_EQ(tok.encode(t, true), ids["ids_special"].get<std::vector<int32_t>>())
        << GetParam() << " " << file;
  }
}

TEST_P(ReferenceIds, SotuCorpus) {
  kiln::Tokenizer tok = kiln::Tokenizer::load(tokenizer_dir(GetParam()));
  auto sotu = expected(GetParam())["sotu"];
  std::vector<std::string> docs = kiln_test::sotu_docs();
  ASSERT_EQ(int64_t(docs.size()), sotu["files"].get<int64_t>()) << "run bash scripts/get-sotu.sh";
  auto t0 = std::chrono::steady_clock::now();
  auto ids = tok.encode_batch(docs, false, 2);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int64_t count = 0;
  uint64_t h = 0xcbf29ce484222325ull;
  size_t bytes = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    count += int64_t(ids[k].size());
    h = kiln_test::fnv1a64(ids[k], h);
    bytes += docs[k].size();
  }
  EXPECT_EQ(count, sotu["tokens"].get<int64_t>()) << GetParam();
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  EXPECT_EQ(std::string(hex), sotu["fnv1a64"].get<std::string>()) << GetParam();
  std::printf("%s: %lld SOTU tokens, %.1f MB/s on 2 threads\n", GetParam().c_str(),
              static_cast<long long>(count), double(bytes) / s / 1e6);
}

INSTANTIATE_TEST_SUITE_P(Tokenizers, ReferenceIds,
                         ::testing::ValuesIn(kiln_test::tokenizer_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
