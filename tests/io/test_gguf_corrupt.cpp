// Corrupt and truncated GGUF files: every variant either loads or throws
// kiln::Error("[gguf] <file>: ..."), never crashes (run this under ASan too) and
// never allocates much more than the file's size.
#include <gtest/gtest.h>

#include <random>

#include "alloc_tracker.h"
#include "gguf_test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::Bytes;
using kiln_test::TempDir;

namespace {

// A file with metadata of every kind and tensors of every dtype.
std::vector<uint8_t> sample_file(const TempDir& dir, size_t big_elems = 0) {
  GgufWriter w;
  w.set("general.architecture", "kiln-test");
  w.set("t.u8", GgufValue(uint8_t(3)));
  w.set("t.i16", GgufValue(int16_t(-3)));
  w.set("t.u32", GgufValue(uint32_t(7)));
  w.set("t.i64", GgufValue(int64_t(-9)));
  w.set("t.f32", GgufValue(0.5f));
  w.set("t.f64", GgufValue(0.25));
  w.set("t.bool", GgufValue(false));
  w.set("t.strings", GgufValue(std::vector<std::string>{"ab", "", "cde"}));
  w.set("t.ints", GgufValue(std::vector<int32_t>{1, 2, 3}));
  w.set("t.bools", GgufValue(std::vector<bool>{true, false}));
  w.set("t.nested", GgufValue::array_of({GgufValue(std::vector<uint16_t>{4, 5}),
                                         GgufValue(std::vector<std::string>{"q"})}));
  auto bytes = [](size_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (size_t k = 0; k < n; ++k) v[k] = uint8_t(seed + 13 * k);
    return v;
  };
  w.add_tensor_data("w", f32, {3, 5}, bytes(60, 1));
  w.add_tensor_data("h", f16, {4}, bytes(8, 2));
  w.add_tensor_data("i", i32, {2, 1, 2}, bytes(16, 3));
  w.add_tensor_data("b", bf16, {3}, bytes(6, 4));
  if (big_elems) w.add_tensor_data("big", f32, {int64_t(big_elems)}, bytes(big_elems * 4, 5));
  const std::string path = dir.file("sample.gguf");
  w.save(path);
  return kiln_test::read_file(path);
}

struct Outcome {
  bool loaded = false;
  std::string error;
  std::vector<std::vector<uint8_t>> data;  // each tensor's bytes when loaded
};

// Parses the file, prints all metadata and reads every tensor. Anything but
// success or kiln::Error is a test failure.
Outcome try_load(const std::string& path, const std::string& variant) {
  Outcome out;
  try {
    GgufFile f(path);
    for (const auto& kv : f.metadata()) (void)kv.second.str();
    for (const GgufTensorInfo& t : f.tensors()) {
      out.data.push_back(f.read_bytes(t.name));
      EXPECT_EQ(out.data.back().size(), t.nbytes) << variant;
      EXPECT_LE(t.offset + t.nbytes, f.file_size()) << variant;
    }
    out.loaded = true;
  } catch (const Error& e) {
    out.error = e.what();
    EXPECT_EQ(out.error.rfind("[gguf] " + path + ": ", 0), 0u) << variant << ": " << out.error;
  } catch (const std::exception& e) {
    ADD_FAILURE() << variant << ": unexpected exception " << typeid(e).name() << ": " << e.what();
  }
  return out;
}

// Writes a variant and checks it loads or fails cleanly without a big allocation.
Outcome check_variant(const std::string& path, const std::vector<uint8_t>& bytes,
                      const std::string& variant) {
  kiln_test::write_file(path, bytes);
  kiln_test::start_tracking_allocations();
  Outcome o = try_load(path, variant);
  size_t largest = kiln_test::stop_tracking_allocations();
  EXPECT_LE(largest, 64 * bytes.size() + 128 * 1024) << variant << " allocated " << largest;
  return o;
}

// End of the last tensor's data: cutting the file anywhere before it must fail.
uint64_t data_end(const std::string& path) {
  GgufFile f(path);
  uint64_t end = 0;
  for (const GgufTensorInfo& t : f.tensors()) end = std::max(end, t.offset + t.nbytes);
  return end;
}

}  // namespace

TEST(GgufCorrupt, TruncatedAtEveryByteFailsUnlessOnlyPaddingIsCut) {
  TempDir dir;
  const std::vector<uint8_t> full = sample_file(dir);
  const uint64_t end = data_end(dir.file("sample.gguf"));
  const Outcome ref = try_load(dir.file("sample.gguf"), "original");
  ASSERT_TRUE(ref.loaded);
  const std::string path = dir.file("cut.gguf");
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + long(len));
    Outcome o = check_variant(path, cut, "truncated to " + std::to_string(len));
    if (len < end) {
      EXPECT_FALSE(o.loaded) << "truncated to " << len << " bytes loaded";
    } else {
      EXPECT_TRUE(o.loaded) << len << ": " << o.error;
      EXPECT_EQ(o.data, ref.data);
    }
  }
}

TEST(GgufCorrupt, LargeFileTruncatedAtDenseSampleOfPositions) {
  TempDir dir;
  const std::vector<uint8_t> full = sample_file(dir, 64 * 1024);  // 256 KiB tensor
  const uint64_t end = data_end(dir.file("sample.gguf"));
  const uint64_t header_end = GgufFile(dir.file("sample.gguf")).data_offset();
  const std::string path = dir.file("cut.gguf");
  int failed = 0;
  for (size_t len = 0; len < full.size(); len += (len < header_end ? 1 : 509)) {
    std::vector<uint8_t> cut(full.begin(), full.begin() + long(len));
    Outcome o = check_variant(path, cut, "truncated to " + std::to_string(len));
    if (len < end) EXPECT_FALSE(o.loaded) << "truncated to " << len;
    failed += !o.loaded;
  }
  EXPECT_GT(failed, 500);
}

TEST(GgufCorrupt, ThousandsOfSeededBitFlipsAndByteWrites) {
  TempDir dir;
  const std::vector<uint8_t> full = sample_file(dir);
  const uint64_t header_end = GgufFile(dir.file("sample.gguf")).data_offset();
  const std::string path = dir.file("flip.gguf");
  std::mt19937_64 rng(12345);
  int errors = 0;
  const int n = 4000;
  for (int v = 0; v < n; ++v) {
    std::vector<uint8_t> bytes = full;
    const int changes = 1 + int(rng() % 4);
    for (int c = 0; c < changes; ++c) {
      // Mostly the header: flips in tensor data are (undetectably) just other values.
      size_t pos = rng() % 5 ? size_t(rng() % header_end) : size_t(rng() % bytes.size());
      if (v % 2) bytes[pos] ^= uint8_t(1u << (rng() % 8));
      else bytes[pos] = uint8_t(rng());
    }
    Outcome o = check_variant(path, bytes, "variant " + std::to_string(v));
    errors += !o.loaded;
  }
  EXPECT_GT(errors, n / 4);  // most header damage is detected
}

// Counts, lengths, dims, types and offsets set to huge or odd values at every
// header position.
TEST(GgufCorrupt, HugeValuesAtEveryHeaderPosition) {
  TempDir dir;
  const std::vector<uint8_t> full = sample_file(dir);
  const uint64_t header_end = GgufFile(dir.file("sample.gguf")).data_offset();
  const std::string path = dir.file("huge.gguf");
  const uint64_t values64[] = {~0ull, 1ull << 63, (1ull << 63) - 1, 1ull << 40, full.size()};
  const uint32_t values32[] = {~0u, 1u << 31, 5u, 2u, 13u};
  for (size_t pos = 0; pos + 8 <= header_end; ++pos) {
    for (uint64_t v : values64) {
      std::vector<uint8_t> bytes = full;
      std::memcpy(bytes.data() + pos, &v, 8);
      check_variant(path, bytes, "u64 " + std::to_string(v) + " at " + std::to_string(pos));
    }
    for (uint32_t v : values32) {
      std::vector<uint8_t> bytes = full;
      std::memcpy(bytes.data() + pos, &v, 4);
      check_variant(path, bytes, "u32 " + std::to_string(v) + " at " + std::to_string(pos));
    }
  }
}

namespace {
std::string error_for(const TempDir& dir, const Bytes& b) {
  const std::string path = dir.file("hand.gguf");
  Outcome o = check_variant(path, b.b, "hand-built");
  EXPECT_FALSE(o.loaded);
  return o.error;
}
#define EXPECT_ERROR_HAS(msg, text) \
  EXPECT_NE((msg).find(text), std::string::npos) << "message: " << (msg)
}  // namespace

TEST(GgufCorrupt, SpecificDefectsHaveClearMessages) {
  TempDir dir;
  {
    Bytes b;
    b.raw("GGML", 4).u32(3).u64(0).u64(0);
    EXPECT_ERROR_HAS(error_for(dir, b), "not a GGUF file");
  }
  EXPECT_ERROR_HAS(error_for(dir, Bytes().raw("GG", 2)), "not a GGUF file (only 2 bytes)");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(0, 0, 1)), "unsupported GGUF version 1");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(1ull << 60, 0)), "tensor count");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(0, 1ull << 60)), "metadata count");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(0, 1).u64(1ull << 62).raw("kkkkkkkk", 8)),
                   "metadata key 0 has length");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(0, 1).str("k").u32(13).u32(0)),
                   "unknown value type 13");
  EXPECT_ERROR_HAS(error_for(dir, Bytes().header(0, 1).str("k").u32(7).u8(2)), "byte value 2");
  EXPECT_ERROR_HAS(
      error_for(dir, Bytes().header(0, 1).str("k").u32(9).u32(5).u64(1ull << 61).u32(0)),
      "is an array of");
  {
    Bytes b;
    b.header(0, 2).str("k").u32(0).u8(1).str("k").u32(0).u8(2);
    EXPECT_ERROR_HAS(error_for(dir, b), "'k' appears twice");
  }
  {
    Bytes b;  // arrays nested 100000 deep must not recurse 100000 deep
    b.header(0, 1).str("deep").u32(9);
    for (int k = 0; k < 100000; ++k) b.u32(9).u64(1);
    b.u32(0).u64(0);
    EXPECT_ERROR_HAS(error_for(dir, b), "nests arrays");
  }
  for (uint32_t align : {0u, 3u, 48u}) {
    Bytes b;
    b.header(0, 1).str("general.alignment").u32(4).u32(align);
    EXPECT_ERROR_HAS(error_for(dir, b), "general.alignment must be a u32 power of 2");
  }
  {
    Bytes b;
    b.header(0, 1).str("general.alignment").u32(5).u32(32);  // i32, not u32
    EXPECT_ERROR_HAS(error_for(dir, b), "general.alignment");
  }
  auto one_tensor = [](std::vector<uint64_t> dims, uint32_t type, uint64_t offset, size_t data) {
    Bytes b;
    b.header(1, 0).tensor("t", std::move(dims), type, offset).pad(32);
    b.b.resize(b.size() + data, 0);
    return b;
  };
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({1, 1, 1, 1, 1}, 0, 0, 4)), "has 5 dims (at most 4)");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 15, 0, 64)), "ggml type 15");  // Q8_K
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 99, 0, 64)), "'t' has ggml type 99");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 2, 0, 64)), "not a multiple of the block size");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({1ull << 32, 1ull << 32}, 0, 0, 4)), "dims too large");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({1ull << 40}, 0, 0, 4)), "more than the file");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({~0ull}, 0, 0, 4)), "dims too large");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 0, 8, 64)), "not a multiple of the alignment 32");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 0, 0, 15)), "truncated: tensor 't' (f32 [4])");
  EXPECT_ERROR_HAS(error_for(dir, one_tensor({4}, 0, 1ull << 62, 64)), "truncated");
  {
    Bytes b;
    b.header(2, 0).tensor("a", {16}, 0, 0).tensor("b", {4}, 0, 32).pad(32);
    b.b.resize(b.size() + 64, 0);
    EXPECT_ERROR_HAS(error_for(dir, b), "overlap");
  }
  {
    Bytes b;
    b.header(2, 0).tensor("a", {4}, 0, 0).tensor("a", {4}, 0, 32).pad(32);
    b.b.resize(b.size() + 64, 0);
    EXPECT_ERROR_HAS(error_for(dir, b), "'a' appears twice");
  }
  {
    Bytes b;
    b.header(1, 0).str(std::string(65, 'n'));
    EXPECT_ERROR_HAS(error_for(dir, b), "name has length 65");
  }
  // Missing files and directories are errors too.
  try {
    GgufFile f(dir.file("missing.gguf"));
    ADD_FAILURE() << "opened a missing file";
  } catch (const Error& e) {
    EXPECT_ERROR_HAS(std::string(e.what()), "cannot open");
  }
  EXPECT_THROW(GgufFile f(dir.path().string()), Error);
}

TEST(GgufCorrupt, EmptyFilesAndZeroSizedTensorsAreValid) {
  TempDir dir;
  const std::string path = dir.file("empty.gguf");
  kiln_test::write_file(path, Bytes().header(0, 0).b);
  GgufFile f(path);
  EXPECT_TRUE(f.tensors().empty());
  Bytes b;
  b.header(1, 0).tensor("z", {0, 3}, 0, 0).pad(32);
  kiln_test::write_file(path, b.b);
  GgufFile g(path);
  EXPECT_EQ(g.tensor_info("z").shape, Shape({3, 0}));
  EXPECT_TRUE(g.read_bytes("z").empty());
}

TEST(GgufCorrupt, AllocationTrackerSeesAllocations) {
  kiln_test::start_tracking_allocations();
  std::vector<uint8_t> v(1 << 20);
  asm volatile("" : : "g"(v.data()) : "memory");  // keep the allocation
  const size_t largest = kiln_test::stop_tracking_allocations();
  EXPECT_GE(largest, v.size());
}
