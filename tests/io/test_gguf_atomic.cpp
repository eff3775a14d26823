// Saving is atomic: a failed save leaves the previous file byte for byte intact
// and no temporary file behind.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <functional>

#include "common/error_check.h"
#include "gguf_test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::TempDir;

namespace {

// Saves a small valid file at `path` and returns its bytes.
std::vector<uint8_t> save_original(const std::string& path) {
  GgufWriter w;
  w.set("kiln.version", "original");
  w.add_tensor_data("x", f32, {2}, std::vector<uint8_t>(8, 0x3f));
  w.save(path);
  return kiln_test::read_file(path);
}

bool has_temp_files(const TempDir& dir) {
  for (const std::string& e : dir.entries())
    if (e.find(".tmp-") != std::string::npos) return true;
  return false;
}

}  // namespace

TEST(GgufAtomic, TensorWithoutDataLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  const std::vector<uint8_t> before = save_original(path);
  Context ctx;
  Tensor w = ctx.param(f32, {4, 4}, "w");  // never allocated
  GgufWriter wr;
  wr.set("kiln.version", "new");
  wr.add_tensor(w);
  std::string e = kiln_test::error_message([&] { wr.save(path); });
  EXPECT_EQ(e.rfind("[gguf] " + path + ": tensor 'w' [4, 4] has no data", 0), 0u) << e;
  EXPECT_EQ(kiln_test::read_file(path), before);
  EXPECT_FALSE(has_temp_files(dir));
  EXPECT_EQ(GgufFile(path).get("kiln.version").as_string(), "original");
}

TEST(GgufAtomic, UnwritableDestinationsFailCleanly) {
  TempDir dir;
  GgufWriter wr;
  wr.add_tensor_data("x", f32, {1}, std::vector<uint8_t>(4));
  std::string e = kiln_test::error_message([&] { wr.save(dir.file("no/such/dir/m.gguf")); });
  EXPECT_NE(e.find("cannot create the temporary file"), std::string::npos) << e;
  kiln_test::write_file(dir.file("plain"), {1, 2, 3});
  EXPECT_THROW(wr.save(dir.file("plain/m.gguf")), Error);  // parent is a file
  EXPECT_EQ(kiln_test::read_file(dir.file("plain")), (std::vector<uint8_t>{1, 2, 3}));
  // The target is a directory: the rename fails after the temp file is complete.
  std::filesystem::create_directory(dir.file("adir"));
  e = kiln_test::error_message([&] { wr.save(dir.file("adir")); });
  EXPECT_NE(e.find("cannot rename"), std::string::npos) << e;
  EXPECT_TRUE(std::filesystem::is_directory(dir.file("adir")));
  EXPECT_FALSE(has_temp_files(dir));
}

// The disk "fills up" in the middle of the tensor data: RLIMIT_FSIZE makes write
// fail with EFBIG once the file would exceed the limit (SIGXFSZ ignored).
TEST(GgufAtomic, WriteErrorMidFileLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  const std::vector<uint8_t> before = save_original(path);

  GgufWriter wr;
  wr.set("kiln.version", "big");
  wr.add_tensor_data("big", f32, {64 * 1024}, std::vector<uint8_t>(256 * 1024, 7));
  struct rlimit old_limit;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &old_limit), 0);
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string e = kiln_test::error_message([&] { wr.save(path); });
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  EXPECT_NE(e.find("cannot write"), std::string::npos) << e;
  EXPECT_EQ(kiln_test::read_file(path), before);
  EXPECT_FALSE(has_temp_files(dir));
  // Without the limit the same save succeeds and replaces the file.
  wr.save(path);
  EXPECT_EQ(GgufFile(path).get("kiln.version").as_string(), "big");
  EXPECT_FALSE(has_temp_files(dir));
}

TEST(GgufAtomic, ReplacingKeepsTheFileModeAndNewFilesAreReadable) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  save_original(path);
  struct stat st;
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0644u);  // not mkstemp's 0600
  ASSERT_EQ(chmod(path.c_str(), 0640), 0);
  GgufWriter wr;
  wr.set("kiln.version", "second");
  wr.save(path);
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0640u);
  EXPECT_EQ(GgufFile(path).get("kiln.version").as_string(), "second");
}

// An open GgufFile keeps reading the file it opened even when a save replaces it.
TEST(GgufAtomic, OpenFileSurvivesReplacement) {
  TempDir dir;
  const std::string path = dir.file("model.gguf");
  save_original(path);
  GgufFile f(path);
  GgufWriter wr;
  wr.add_tensor_data("x", f32, {2}, std::vector<uint8_t>(8, 0x11));
  wr.save(path);
  EXPECT_EQ(f.read_bytes("x"), std::vector<uint8_t>(8, 0x3f));
  EXPECT_EQ(GgufFile(path).read_bytes("x"), std::vector<uint8_t>(8, 0x11));
}
