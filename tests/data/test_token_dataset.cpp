// TokenDataset and the text-corpus loader: the corpus definition (file order, one
// '\n' after each file), the 90/10 split, consecutive evaluation windows, seeded
// random training windows, errors, and a training loop through OptContext.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "common/error_check.h"
#include "kiln/kiln.h"
#include "kiln/token_dataset.h"

using namespace kiln;
namespace fs = std::filesystem;

namespace {

// A fresh directory under the test's temp dir, removed at the end of the test.
struct TokenDir {
  TokenDir() {
    path = fs::temp_directory_path() /
           ("kiln_tokens_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TokenDir() { fs::remove_all(path); }
  void write(const std::string& name, const std::string& text) const {
    std::ofstream(path / name, std::ios::binary) << text;
  }
  fs::path path;
};

TokenDataset counting(int64_t n) {  // token i = i % 256
  std::vector<uint8_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) t[size_t(i)] = uint8_t(i % 256);
  return TokenDataset(std::move(t));
}

struct Batch {
  Context ctx;
  Tensor x, y;
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf;
  Batch(int64_t B, int64_t T, Shape label_shape = {}) {
    x = ctx.input(i32, {B, T}, "x");
    y = ctx.input(i32, label_shape.ndim() ? label_shape : Shape{B, T}, "y");
    buf = allocate_tensors(ctx, cpu);
  }
};

}  // namespace

TEST(TextCorpus, FilesInNameOrderEachFollowedByNewline) {
  TokenDir d;
  d.write("b_second.txt", "world");
  d.write("a_first.txt", "hello");
  d.write("B_upper.txt", "X");     // byte order: 'B' < 'a'
  d.write("notes.md", "ignored");  // not a .txt file
  d.write("empty.txt", "");
  const TokenDataset c = load_text_corpus(d.path.string());
  const std::string got(c.tokens().begin(), c.tokens().end());
  EXPECT_EQ(got, "X\nhello\nworld\n\n");
  EXPECT_EQ(c.size(), 15);
}

TEST(TextCorpus, MissingDataNamesPathAndScript) {
  TokenDir d;
  const std::string missing = (d.path / "sotu").string();
  const std::string m =
      kiln_test::error_message([&] { load_text_corpus(missing, "bash scripts/get-sotu.sh"); });
  EXPECT_NE(m.find("[corpus]"), std::string::npos) << m;
  EXPECT_NE(m.find(missing), std::string::npos) << m;
  EXPECT_NE(m.find("bash scripts/get-sotu.sh"), std::string::npos) << m;
  const std::string e = kiln_test::error_message(
      [&] { load_text_corpus(d.path.string(), "bash scripts/get-sotu.sh"); });
  EXPECT_NE(e.find("no .txt files"), std::string::npos) << e;
  EXPECT_NE(e.find("get-sotu.sh"), std::string::npos) << e;
}

TEST(TokenDataset, SplitIsFloorOfFractionAndSharesTokens) {
  const TokenDataset c = counting(1003);
  auto [train, val] = c.split(0.9);
  EXPECT_EQ(train.size(), 902);  // floor(1003 * 0.9) = floor(902.7)
  EXPECT_EQ(val.size(), 101);
  EXPECT_EQ(train.tokens().data(), c.tokens().data());  // no copy
  EXPECT_EQ(val.tokens()[0], uint8_t(902 % 256));
  EXPECT_EQ(val.tokens().data(), c.tokens().data() + 902);
  auto [all, none] = c.split(1.0);
  EXPECT_EQ(all.size(), 1003);
  EXPECT_EQ(none.size(), 0);
  EXPECT_THROW(c.split(1.5), Error);
}

TEST(TokenDataset, EvaluationWindowsAreConsecutiveAndNonOverlapping) {
  const TokenDataset c = counting(1000);
  auto [train, val] = c.split(0.5);  // val holds tokens 500..999
  const int64_t B = 3, T = 7;
  EXPECT_EQ(val.n_windows(T), 500 / 8);
  EXPECT_EQ(val.n_batches(B, T), 62 / 3);
  Batch b(B, T);
  val.get_batch(b.x, b.y, 2);
  const std::vector<int32_t> x = b.x.get<int32_t>(), y = b.y.get<int32_t>();
  for (int64_t r = 0; r < B; ++r) {
    const int64_t start = 500 + (2 * B + r) * (T + 1);  // window 2B + r
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(x[size_t(r * T + t)], int32_t((start + t) % 256));
      EXPECT_EQ(y[size_t(r * T + t)], int32_t((start + t + 1) % 256));
    }
  }
  const std::string m =
      kiln_test::error_message([&] { val.get_batch(b.x, b.y, val.n_batches(B, T)); });
  EXPECT_NE(m.find("[token_dataset]"), std::string::npos) << m;
  EXPECT_NE(m.find("outside"), std::string::npos) << m;
}

TEST(TokenDataset, RandomWindowsAreSeededAndCoverEveryOffset) {
  const TokenDataset c = counting(20);
  const int64_t T = 4;
  std::mt19937_64 r1(7), r2(7), r3(8);
  std::set<int64_t> seen;
  std::vector<int64_t> a, b, other;
  for (int i = 0; i < 2000; ++i) {
    a.push_back(c.random_offset(r1, T));
    b.push_back(c.random_offset(r2, T));
    other.push_back(c.random_offset(r3, T));
    seen.insert(a.back());
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 20 - T - 1);  // the last full window
  EXPECT_EQ(seen.size(), size_t(20 - T));

  // A batch: row b is the window at the b-th offset, labels shifted by one.
  const TokenDataset big = counting(5000);
  Batch bt(5, 9, Shape{45});  // labels flattened, as cross_entropy takes them
  std::mt19937_64 rs(3), rcheck(3);
  big.sample_batch(bt.x, bt.y, rs);
  const std::vector<int32_t> x = bt.x.get<int32_t>(), y = bt.y.get<int32_t>();
  for (int64_t r = 0; r < 5; ++r) {
    const int64_t o = big.random_offset(rcheck, 9);
    for (int64_t t = 0; t < 9; ++t) {
      EXPECT_EQ(x[size_t(r * 9 + t)], int32_t((o + t) % 256));
      EXPECT_EQ(y[size_t(r * 9 + t)], int32_t((o + t + 1) % 256));
    }
  }
}

TEST(TokenDataset, BadTensorsAndTooShortData) {
  const TokenDataset c = counting(10);
  std::mt19937_64 rng(1);
  Batch ok(2, 4);
  Batch too_long(1, 10);
  EXPECT_NE(kiln_test::error_message([&] {
              c.sample_batch(too_long.x, too_long.y, rng);
            }).find("does not fit"),
            std::string::npos);
  Context ctx;
  Tensor xf = ctx.input(f32, {2, 4}, "xf");
  Tensor yshort = ctx.input(i32, {2, 3}, "yshort");
  CpuBackend cpu{1};
  auto buf = allocate_tensors(ctx, cpu);
  const std::string m = kiln_test::error_message([&] { c.sample_batch(xf, ok.y, rng); });
  EXPECT_NE(m.find("'xf'"), std::string::npos) << m;
  EXPECT_NE(m.find("i32"), std::string::npos) << m;
  const std::string l = kiln_test::error_message([&] { c.sample_batch(ok.x, yshort, rng); });
  EXPECT_NE(l.find("'yshort'"), std::string::npos) << l;
}

// Token ids (u16 and u32): the same windows as bytes, ids kept at their width.
TEST(TokenIds, U16BatchesEqualTheHandComputedWindows) {
  const TokenDataset c(std::vector<uint16_t>{65535, 0, 300, 65534, 7, 40000, 1, 2, 9}, 65536);
  EXPECT_EQ(c.id_bytes(), 2);
  EXPECT_EQ(c.vocab_size(), 65536);
  EXPECT_EQ(c.n_windows(3), 2);  // windows of 4 ids: [0, 4), [4, 8); id 9 is left over
  Batch b(2, 3);
  c.get_batch(b.x, b.y, 0);
  EXPECT_EQ(b.x.get<int32_t>(), (std::vector<int32_t>{65535, 0, 300, 7, 40000, 1}));
  EXPECT_EQ(b.y.get<int32_t>(), (std::vector<int32_t>{0, 300, 65534, 40000, 1, 2}));
  auto [train, val] = c.split(0.5);  // ids [0, 4) and [4, 9)
  EXPECT_EQ(val.id(0), 7u);
  EXPECT_EQ(val.id(4), 9u);
  Batch one(1, 3);
  std::mt19937_64 r1(5), r2(5);
  val.sample_batch(one.x, one.y, r1);
  const int64_t o = val.random_offset(r2, 3);
  const std::vector<int32_t> all = {7, 40000, 1, 2, 9};
  EXPECT_EQ(one.x.get<int32_t>(), std::vector<int32_t>(all.begin() + o, all.begin() + o + 3));
  EXPECT_EQ(one.y.get<int32_t>(), std::vector<int32_t>(all.begin() + o + 1, all.begin() + o + 4));
}

TEST(TokenIds, U32BatchesEqualTheHandComputedWindows) {
  const TokenDataset c(std::vector<uint32_t>{151000, 5, 70000, 1, 2, 3, 99999, 151935}, 151936);
  EXPECT_EQ(c.id_bytes(), 4);
  Batch b(1, 3, Shape{3});
  c.get_batch(b.x, b.y, 1);
  EXPECT_EQ(b.x.get<int32_t>(), (std::vector<int32_t>{2, 3, 99999}));
  EXPECT_EQ(b.y.get<int32_t>(), (std::vector<int32_t>{3, 99999, 151935}));
  c.get_batch(b.x, Tensor(), 0);  // inputs only
  EXPECT_EQ(b.x.get<int32_t>(), (std::vector<int32_t>{151000, 5, 70000}));

  // A vocabulary up to 2^32 is held; a window with an id that i32 cannot hold
  // is an error, the others batch.
  const TokenDataset huge(std::vector<uint32_t>{4000000000u, 5, 6, 7, 8, 9, 10, 11}, int64_t(1)
                                                                                         << 32);
  EXPECT_EQ(huge.id(0), 4000000000u);
  EXPECT_KILN_ERROR(huge.get_batch(b.x, b.y, 0), "token_dataset", "4000000000",
                    "does not fit the i32");
  huge.get_batch(b.x, b.y, 1);
  EXPECT_EQ(b.x.get<int32_t>(), (std::vector<int32_t>{8, 9, 10}));
}

TEST(TokenIds, IdsAtOrAboveTheVocabularyAreErrors) {
  EXPECT_KILN_ERROR(TokenDataset(std::vector<uint16_t>{1, 2, 500, 3}, 500), "token_dataset",
                    "id 500 at position 2", "vocab_size 500");
  EXPECT_KILN_ERROR(TokenDataset(std::vector<uint32_t>{70000}, 65536), "token_dataset",
                    "id 70000 at position 0", "vocab_size 65536");
  EXPECT_KILN_ERROR(TokenDataset(std::vector<uint16_t>{1}, 70000), "token_dataset",
                    "vocab_size 70000", "16-bit");
  EXPECT_KILN_ERROR(TokenDataset(std::vector<uint32_t>{}, 0), "token_dataset", "vocab_size 0");
  EXPECT_KILN_ERROR(TokenDataset(std::vector<uint32_t>{1}, (int64_t(1) << 32) + 1), "token_dataset",
                    "vocab_size 4294967297");
  const TokenDataset ids(std::vector<uint16_t>{1, 2}, 3);
  EXPECT_KILN_ERROR((void)ids.tokens(), "token_dataset", "byte view", "16-bit ids");
  EXPECT_KILN_ERROR((void)ids.id(2), "token_dataset", "token 2", "[0, 2)");
}

TEST(TokenIds, BytesAreIdsOfAVocabularyOf256) {
  const TokenDataset c = counting(300);
  EXPECT_EQ(c.id_bytes(), 1);
  EXPECT_EQ(c.vocab_size(), 256);
  EXPECT_EQ(c.split(0.5).second.id(106), uint32_t(c.tokens()[256]));
}

// The dataset feeds an OptContext: a bigram model (logits = row of W at the
// input token) learns a deterministic cycle, and evaluation reads the validation
// windows. Loss falls from log(256) towards 0.
TEST(TokenDataset, TrainsABigramModelThroughOptContext) {
  std::vector<uint8_t> text;
  const std::string cycle = "kiln:0123. ";  // each byte has one successor
  for (int i = 0; i < 400; ++i) text.insert(text.end(), cycle.begin(), cycle.end());
  auto [train, val] = TokenDataset(text).split(0.9);
  const int64_t B = 8, T = 16, V = 256;
  Context ctx;
  Tensor x = ctx.input(i32, {B, T}, "tokens");
  Tensor y = ctx.input(i32, {B, T}, "next");
  Tensor w = ctx.param(f32, {V, V}, "w");
  Tensor logits = embedding(w, x).reshape({B * T, V});
  OptConfig cfg;
  cfg.inputs = x;
  cfg.labels = y;
  cfg.outputs = logits;
  cfg.loss = LossKind::user;  // logits are [B*T, V], not [B, C]
  cfg.user_loss = cross_entropy(logits, y.reshape({B * T}));
  cfg.n_threads = 1;
  AdamWParams ap;
  ap.lr = 0.1f;
  cfg.schedule = schedule::constant({ap, {}});
  OptContext opt(cfg);
  w.fill_zero();
  std::mt19937_64 rng(42);
  auto val_loss = [&] {
    double s = 0;
    const int64_t nb = val.n_batches(B, T);
    for (int64_t b = 0; b < nb; ++b) {
      val.get_batch(opt.inputs(), opt.labels(), b);
      s += opt.eval_batch();
    }
    return s / double(nb);
  };
  const double before = val_loss();
  EXPECT_NEAR(before, std::log(256.0), 1e-4);
  for (int step = 0; step < 60; ++step) {
    train.sample_batch(opt.inputs(), opt.labels(), rng);
    opt.train_batch();
  }
  EXPECT_LT(val_loss(), 0.1);
}

// The real corpus, when scripts/get-sotu.sh has fetched it: the sizes docs/gpt.md
// states (skipped otherwise; CI does not download it).
TEST(TextCorpus, StateOfTheUnionSizes) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/data/sotu";
  if (!fs::is_directory(dir))
    GTEST_SKIP() << "no corpus in " << dir << " (scripts/get-sotu.sh fetches it)";
  const TokenDataset c = load_text_corpus(dir, "bash scripts/get-sotu.sh");
  EXPECT_EQ(c.size(), 10761646);  // 10761413 bytes of text + 233 newlines
  auto [train, val] = c.split(0.9);
  EXPECT_EQ(train.size(), 9685481);
  EXPECT_EQ(val.size(), 1076165);
  EXPECT_EQ(val.n_windows(64), 16556);
  const std::string head(c.tokens().begin(), c.tokens().begin() + 17);
  EXPECT_EQ(head, "Fellow-Citizens o");
}
