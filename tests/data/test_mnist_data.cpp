// The MNIST IDX loader (examples/mnist/mnist_data.cpp) on small synthetic files
// written here: valid, wrong magic, wrong dims, truncated, count mismatch,
// missing. The real files are checked too when scripts/get-mnist.sh has run.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/kiln.h"
#include "mnist_data.h"

using namespace kiln;

namespace {

using kiln_test::TempDir;

void be32(std::vector<uint8_t>& b, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) b.push_back(uint8_t(v >> s));
}

std::vector<uint8_t> images_file(uint32_t n, uint32_t rows = 28, uint32_t cols = 28,
                                 uint32_t magic = 2051) {
  std::vector<uint8_t> b;
  be32(b, magic);
  be32(b, n);
  be32(b, rows);
  be32(b, cols);
  for (uint32_t i = 0; i < n * rows * cols; ++i) b.push_back(uint8_t(i * 7 + i / 784));
  return b;
}

std::vector<uint8_t> labels_file(uint32_t n, uint32_t magic = 2049) {
  std::vector<uint8_t> b;
  be32(b, magic);
  be32(b, n);
  for (uint32_t i = 0; i < n; ++i) b.push_back(uint8_t((i * 3) % 10));
  return b;
}

void write(const std::string& path, const std::vector<uint8_t>& b) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(b.data()), long(b.size()));
}

}  // namespace

TEST(MnistData, LoadsValidIdxFilesAsU8SamplesAndI32Labels) {
  TempDir dir;
  write(dir.file(mnist::kTrainImages), images_file(20));
  write(dir.file(mnist::kTrainLabels), labels_file(20));
  Dataset ds = mnist::load_train(dir.str(), /*shard_size=*/10);
  EXPECT_EQ(ds.size(), 20);
  EXPECT_EQ(ds.sample_shape(), Shape({28, 28}));
  EXPECT_EQ(ds.data_type(), DataType::u8);
  EXPECT_EQ(ds.label_type(), DataType::i32);
  EXPECT_EQ(ds.shard_size(), 10);
  std::vector<uint8_t> img = images_file(20);
  EXPECT_TRUE(std::equal(ds.data<uint8_t>().begin(), ds.data<uint8_t>().end(), img.begin() + 16));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(ds.labels<int32_t>()[size_t(i)], (i * 3) % 10);

  // A batch into [B, 784] f32 is the pixels / 255.
  Context ctx;
  Tensor x = ctx.input(f32, {4, 784});
  Tensor y = ctx.input(i32, {4});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  ds.get_batch(x, y, 1);
  EXPECT_FLOAT_EQ(x.get<float>()[0], float(img[16 + 4 * 784]) / 255.0f);
  EXPECT_EQ(y.get<int32_t>(), (std::vector<int32_t>{2, 5, 8, 1}));
}

TEST(MnistData, WrongOrMissingFilesSayWhichAndHowToFix) {
  TempDir dir;
  const std::string img = dir.file("img"), lab = dir.file("lab");
  auto check = [&](const std::string& what, const std::string& file, const std::string& text) {
    std::string e = kiln_test::error_message([&] { mnist::load_idx(img, lab); });
    EXPECT_EQ(e.rfind("[mnist] ", 0), 0u) << what << ": " << e;
    EXPECT_NE(e.find(file), std::string::npos) << what << ": " << e;
    EXPECT_NE(e.find(text), std::string::npos) << what << ": " << e;
    EXPECT_NE(e.find("run scripts/get-mnist.sh to download it"), std::string::npos)
        << what << ": " << e;
  };
  check("missing images", img, "file not found");
  write(img, images_file(3));
  check("missing labels", lab, "file not found");
  write(lab, labels_file(3));
  EXPECT_EQ(mnist::load_idx(img, lab).size(), 3);

  write(img, images_file(3, 28, 28, 2049));
  check("labels file given as images", img, "magic number is 2049, expected 2051");
  write(img, images_file(3));
  write(lab, images_file(3));
  check("images file given as labels", lab, "magic number is 2051, expected 2049");
  write(img, images_file(3, 32, 32));
  write(lab, labels_file(3));
  check("wrong dims", img, "images are 32x32, expected 28x28");

  std::vector<uint8_t> cut = images_file(3);
  cut.resize(cut.size() - 1);
  write(img, cut);
  check("truncated images", img, "truncated or damaged");
  write(img, images_file(3));
  std::vector<uint8_t> lab_cut = labels_file(3);
  lab_cut.pop_back();
  write(lab, lab_cut);
  check("truncated labels", lab, "truncated or damaged");
  write(lab, std::vector<uint8_t>{0, 0, 8});
  check("tiny labels", lab, "too short");
  write(lab, labels_file(4));
  check("count mismatch", "has 3 images but", "has 4 labels");
  std::vector<uint8_t> bad_label = labels_file(3);
  bad_label.back() = 10;
  write(lab, bad_label);
  check("label out of range", lab, "label 2 is 10");
  // Huge counts in the header are caught by the size check, not by allocating.
  std::vector<uint8_t> huge = images_file(1);
  huge[4] = huge[5] = huge[6] = huge[7] = 0xff;
  write(img, huge);
  check("huge count", img, "truncated or damaged");
  // Sample counts must fit the shard size.
  write(img, images_file(3));
  write(lab, labels_file(3));
  EXPECT_THROW(mnist::load_idx(img, lab, 2), Error);
}

TEST(MnistData, RealFilesWhenDownloaded) {
  const std::string dir = std::string(KILN_SOURCE_DIR) + "/data/mnist";
  if (!std::filesystem::exists(dir + "/" + mnist::kTrainImages))
    GTEST_SKIP() << "no MNIST in " << dir << " (scripts/get-mnist.sh fetches it)";
  Dataset train = mnist::load_train(dir);
  Dataset test = mnist::load_test(dir);
  EXPECT_EQ(train.size(), 60000);
  EXPECT_EQ(test.size(), 10000);
  EXPECT_EQ(train.labels<int32_t>()[0], 5);  // the well-known first digits
  EXPECT_EQ(test.labels<int32_t>()[0], 7);
  std::vector<int> counts(10);
  for (int32_t l : train.labels<int32_t>()) counts[size_t(l)]++;
  for (int c : counts) EXPECT_GT(c, 5000);
}
