// GGUF regressions: overflow hidden by a zero dim, huge alignments, lookups by
// name in files with many tensors, metadata of the wrong type naming the file
// and key, and temporary files left by
// killed saves (2).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>

#include "common/error_check.h"
#include "gguf_test_util.h"
#include "io/atomic_file.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::Bytes;
using kiln_test::TempDir;

namespace {

#define EXPECT_HAS(msg, text) EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)

std::string write(const TempDir& dir, const Bytes& b, const std::string& name = "t.gguf") {
  const std::string path = dir.file(name);
  kiln_test::write_file(path, b.b);
  return path;
}

}  // namespace

// dims (innermost first) [0, 2^40, 2^40]: the element count is 0, but the
// product of the other two overflows int64 and Shape::numel (outermost first)
// would compute it. Every partial product must fit.
TEST(GgufLimits, ZeroDimDoesNotHideOverflow) {
  TempDir dir;
  for (std::vector<uint64_t> dims : {std::vector<uint64_t>{0, 1ull << 40, 1ull << 40},
                                     std::vector<uint64_t>{1ull << 40, 1ull << 40, 0},
                                     std::vector<uint64_t>{1ull << 31, 0, 1ull << 31, 4}}) {
    Bytes b;
    b.header(1, 0).tensor("t", dims, 0, 0).pad(32);
    const std::string path = write(dir, b);
    const std::string e = kiln_test::error_message([&] { GgufFile f(path); });
    EXPECT_EQ(e.rfind("[gguf] " + path + ": tensor 't' has dims too large", 0), 0u) << e;
  }
  // Large but representable with a zero: fine ([2^20, 0, 2^20] f32 is 2^42 bytes
  // per outer row, well inside int64).
  Bytes ok;
  ok.header(1, 0).tensor("t", {1ull << 20, 0, 1ull << 20}, 0, 0).pad(32);
  GgufFile f(write(dir, ok));
  EXPECT_EQ(f.tensor_info("t").shape, Shape({1 << 20, 0, 1 << 20}));
  EXPECT_EQ(f.tensor_info("t").nbytes, 0u);
  // The element size counts too: 2^62 f32 elements are 2^64 bytes.
  Bytes big;
  big.header(1, 0).tensor("t", {1ull << 31, 1ull << 31, 0}, 0, 0).pad(32);
  const std::string path = write(dir, big);
  EXPECT_HAS(kiln_test::error_message([&] { GgufFile g(path); }), "dims too large");
}

TEST(GgufLimits, AlignmentIsAtMost64KiB) {
  TempDir dir;
  for (uint32_t align : {1u << 17, 1u << 30, 1u << 31}) {
    Bytes b;
    b.header(0, 1).str("general.alignment").u32(4).u32(align);
    const std::string path = write(dir, b);
    const std::string e = kiln_test::error_message([&] { GgufFile f(path); });
    EXPECT_EQ(
        e.rfind("[gguf] " + path + ": general.alignment must be a u32 power of 2 of at most 65536",
                0),
        0u)
        << e;
  }
  Bytes b;
  b.header(0, 1).str("general.alignment").u32(4).u32(1u << 16);
  EXPECT_EQ(GgufFile(write(dir, b)).alignment(), 1u << 16);
  GgufWriter w;
  EXPECT_HAS(kiln_test::error_message([&] { w.set_alignment(1u << 30); }), "at most 65536");
  w.set_alignment(1u << 16);
}

// Reading every tensor of a file by name was quadratic: 100k tensors took
// 11.6 s. With the index it is a few hundred milliseconds even under ASan; the
// bound leaves a wide margin for a loaded machine but not for n^2 / 2 string
// comparisons (5e9).
TEST(GgufLimits, ReadingEveryTensorByNameIsLinear) {
  TempDir dir;
  const int n = 100000;
  const std::string path = dir.file("many.gguf");
  {
    GgufWriter w;  // add_tensor_data's duplicate check was quadratic too
    w.set_alignment(4);
    const std::vector<uint8_t> four(4, 0);
    for (int i = 0; i < n; ++i) w.add_tensor_data("t" + std::to_string(i), f32, {1}, four);
    w.save(path);
  }
  const auto t0 = std::chrono::steady_clock::now();
  GgufFile f(path);
  ASSERT_EQ(f.tensors().size(), size_t(n));
  size_t found = 0;
  for (int i = n - 1; i >= 0; --i) found += f.find_tensor("t" + std::to_string(i)) != nullptr;
  EXPECT_EQ(found, size_t(n));
  EXPECT_EQ(f.tensor_info("t99999").offset, f.data_offset() + 99999 * 4);
  EXPECT_EQ(f.find_tensor("t100000"), nullptr);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(s, 3.0) << "open + 100k lookups by name took " << s << " s";
}

TEST(GgufLimits, WrongTypeMetadataNamesFileAndKey) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  GgufWriter w;
  w.set("kiln.opt.step", "twelve");
  w.set("kiln.big", GgufValue(~uint64_t(0)));
  w.set("kiln.neg", GgufValue(int32_t(-3)));
  w.set("kiln.list", GgufValue(std::vector<std::string>{"a"}));
  w.save(path);
  GgufFile f(path);
  const std::string where = "[gguf] " + path + ": metadata '";
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.opt.step").as_int(); }),
            where + "kiln.opt.step' is string, not an integer");
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.opt.step").as_float(); }),
            where + "kiln.opt.step' is string, not a number");
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.big").as_int(); }),
            where + "kiln.big' is 18446744073709551615, which does not fit in int64");
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.neg").as_uint(); }),
            where + "kiln.neg' is -3, not an unsigned integer");
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.list").as_string(); }),
            where + "kiln.list' is array, not a string");
  EXPECT_EQ(kiln_test::error_message([&] { (void)f.get("kiln.neg").as_strings(); }),
            where + "kiln.neg' is i32, not an array of strings");
  // Values made in code have no file: the message says "value".
  EXPECT_EQ(kiln_test::error_message([] { (void)GgufValue("x").as_int(); }),
            "[gguf] value is string, not an integer");
  // The origin is not part of the value.
  EXPECT_TRUE(f.get("kiln.opt.step") == GgufValue("twelve"));
}

// ---- temporary files of killed saves (item 2) ----

namespace {

std::vector<std::string> temp_files(const TempDir& dir) {
  std::vector<std::string> out;
  for (const std::string& e : dir.entries())
    if (e.find(".tmp-") != std::string::npos) out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}

void touch(const std::string& path, size_t bytes = 16) {
  kiln_test::write_file(path, std::vector<uint8_t>(bytes, 0xab));
}

void make_old(const std::string& path, int seconds) {
  const auto t = std::filesystem::last_write_time(path);
  std::filesystem::last_write_time(path, t - std::chrono::seconds(seconds));
}

// A pid that certainly exited: a child that was started and reaped.
pid_t dead_pid() {
  pid_t p = ::fork();
  if (p == 0) ::_exit(0);
  int status = 0;
  ::waitpid(p, &status, 0);
  return p;
}

void save_small(const std::string& path) {
  GgufWriter w;
  w.add_tensor_data("x", f32, {1}, std::vector<uint8_t>(4, 1));
  w.save(path);
}

}  // namespace

TEST(GgufLimits, SaveRemovesStaleTempFilesOfItsTargetOnly) {
  TempDir dir;
  const std::string target = dir.file("model.gguf");
  const std::string host = io::temp_host_tag();
  const std::string dead = std::to_string(dead_pid());
  const std::string alive = std::to_string(::getppid());  // our parent is alive
  const std::string self = std::to_string(::getpid());
  // Stale, removed: a killed save on this host (dead pid), an old file of another
  // host, an old file in the format before pids, an old one with a live pid.
  touch(target + ".tmp-" + host + "-" + dead + "-aB3dE9", 1 << 20);
  touch(target + ".tmp-" + host + "-" + dead + "-Zz0000");
  touch(target + ".tmp-otherhost-12345-Qw12er");
  make_old(target + ".tmp-otherhost-12345-Qw12er", io::kStaleTempAgeSeconds + 60);
  touch(target + ".tmp-X1y2Z3");
  make_old(target + ".tmp-X1y2Z3", io::kStaleTempAgeSeconds + 60);
  touch(target + ".tmp-" + host + "-" + alive + "-oldLIV");
  make_old(target + ".tmp-" + host + "-" + alive + "-oldLIV", io::kStaleTempAgeSeconds + 60);
  // Kept: in progress (live pid: our parent, ourselves), recent files of other
  // hosts and of the old format, other targets, names that are not ours, and
  // a directory.
  const std::vector<std::string> kept = {
      "model.gguf.tmp-" + host + "-" + alive + "-aaaaaa",
      "model.gguf.tmp-" + host + "-" + self + "-bbbbbb",
      "model.gguf.tmp-otherhost-12345-cccccc",
      "model.gguf.tmp-dddddd",
      "other.gguf.tmp-" + host + "-" + dead + "-eeeeee",
      "model.gguf2.tmp-" + host + "-" + dead + "-ffffff",
      "xmodel.gguf.tmp-" + host + "-" + dead + "-gggggg",
      "model.gguf.tmp-" + host + "-" + dead + "-hhhhhh.bak",
      "model.gguf.tmp-" + host + "-" + dead + "-iii",
      "model.gguf.tmp-notes.txt",
  };
  for (const std::string& k : kept) touch(dir.file(k));
  std::filesystem::create_directory(target + ".tmp-" + host + "-" + dead + "-dir123");
  ASSERT_EQ(temp_files(dir).size(), kept.size() + 5 + 1);

  save_small(target);

  std::vector<std::string> want = kept;
  want.push_back("model.gguf.tmp-" + host + "-" + dead + "-dir123");
  std::sort(want.begin(), want.end());
  EXPECT_EQ(temp_files(dir), want);
  EXPECT_EQ(GgufFile(target).read_bytes("x"), std::vector<uint8_t>(4, 1));
}

// The real thing: a child process is killed with SIGKILL in the middle of a
// save (it stops itself once its temporary file exists); the previous file is
// intact, and each later save removes the leftover: after any number of killed
// saves at most one temporary file (the last one's) is left, and a completed
// save leaves none.
TEST(GgufLimits, KilledSaveLeavesATempFileTheNextSaveRemoves) {
  TempDir dir;
  const std::string target = dir.file("model.gguf");
  save_small(target);
  const std::vector<uint8_t> before = kiln_test::read_file(target);
  for (int round = 0; round < 3; ++round) {
    pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      io::AtomicFile out(target, "gguf");
      out.write(before.data(), before.size() / 2);
      ::raise(SIGSTOP);  // the parent kills us here, before commit()
      ::_exit(1);
    }
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
    ASSERT_TRUE(WIFSTOPPED(status));
    ::kill(child, SIGKILL);
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));
    EXPECT_EQ(temp_files(dir).size(), 1u) << "after killed save " << round;
  }
  EXPECT_EQ(kiln_test::read_file(target), before);
  save_small(target);
  EXPECT_TRUE(temp_files(dir).empty()) << temp_files(dir).front();
}
