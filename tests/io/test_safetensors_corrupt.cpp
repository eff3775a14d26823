// Corrupt safetensors files, one test per defect the reader must refuse, plus
// truncation at every byte and seeded damage: every variant either loads or
// throws kiln::Error("[safetensors] <file>: ..."), never crashes (run this
// under ASan too) and never allocates much more than the file's size. Files are
// built byte by byte from the spec (safetensors_test_util.h).
#include <gtest/gtest.h>

#include <random>

#include "alloc_tracker.h"
#include "kiln/kiln.h"
#include "kiln/safetensors.h"
#include "safetensors_test_util.h"

using namespace kiln;
using kiln_test::pad8;
using kiln_test::safetensors_bytes;
using kiln_test::TempDir;

namespace {

// Opens the file and reads every tensor; returns the error ("" when it loaded).
// Anything but kiln::Error is a failure, and so is a big allocation.
std::string outcome(const TempDir& dir, const std::vector<uint8_t>& bytes,
                    const std::string& variant = "") {
  const std::string path = dir.file("c.safetensors");
  kiln_test::write_file(path, bytes);
  std::string error;
  kiln_test::start_tracking_allocations();
  try {
    SafetensorsFile f(path);
    for (const TensorInfo& t : f.tensors())
      EXPECT_EQ(f.read_bytes(t.name).size(), t.nbytes) << variant;
  } catch (const Error& e) {
    error = e.what();
    EXPECT_EQ(error.rfind("[safetensors] " + path + ": ", 0), 0u) << variant << ": " << error;
  } catch (const std::exception& e) {
    ADD_FAILURE() << variant << ": unexpected exception " << typeid(e).name() << ": " << e.what();
  }
  const size_t largest = kiln_test::stop_tracking_allocations();
  EXPECT_LE(largest, 64 * bytes.size() + 128 * 1024) << variant << " allocated " << largest;
  return error;
}

// The error for a header (padded to 8) and a data section.
std::string error_for(const std::string& header, const std::vector<uint8_t>& data) {
  TempDir dir;
  return outcome(dir, safetensors_bytes(pad8(header), data));
}

#define EXPECT_ERROR(header, data, text)                                      \
  do {                                                                        \
    const std::string e_ = error_for(header, data);                           \
    EXPECT_NE(e_.find(text), std::string::npos) << "message: '" << e_ << "'"; \
  } while (0)

const std::vector<uint8_t> k8(8, 0);

// A good file to start from: two F32 tensors and metadata.
std::vector<uint8_t> good_file() {
  const std::string h =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[16,24]}})";
  std::vector<uint8_t> data;
  kiln_test::append<float>(data, {1, 2, 3, 4, 5, 6});
  return safetensors_bytes(pad8(h), data);
}

}  // namespace

TEST(SafetensorsCorrupt, TheGoodFileLoads) {
  TempDir dir;
  EXPECT_EQ(outcome(dir, good_file()), "");
}

TEST(SafetensorsCorrupt, FileShorterThanTheHeaderLength) {
  TempDir dir;
  EXPECT_NE(outcome(dir, {1, 2, 3}).find("3 bytes, fewer than the 8 of the header length"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, HeaderLengthOverTheCapIsRefusedBeforeAllocating) {
  TempDir dir;
  const std::string e = outcome(dir, safetensors_bytes("{}", {}, kSafetensorsMaxHeader + 1));
  EXPECT_NE(e.find("header length 100000001 is over kiln's limit of 100000000 bytes"),
            std::string::npos)
      << e;
  EXPECT_NE(outcome(dir, safetensors_bytes("{}", {}, ~uint64_t(0) - 1)).find("over kiln's limit"),
            std::string::npos);
}

TEST(SafetensorsCorrupt, HeaderLengthPastTheEndOfTheFile) {
  TempDir dir;
  const std::string e = outcome(dir, safetensors_bytes("{}      ", {}, 4096));
  EXPECT_NE(e.find("truncated: the header length is 4096 but only 8 bytes follow it"),
            std::string::npos)
      << e;
}

TEST(SafetensorsCorrupt, HeaderIsNotJson) {
  EXPECT_ERROR(R"({"w":{"dtype":"F32",)", {}, "the header is not valid JSON");
  EXPECT_ERROR(R"({"w" 1})", {}, "the header is not valid JSON");
  EXPECT_ERROR(R"({} {})", {}, "the header is not valid JSON");
}

TEST(SafetensorsCorrupt, HeaderDoesNotStartWithABrace) {
  EXPECT_ERROR("[]", {}, "does not start with '{'");
  EXPECT_ERROR(" {}", {}, "does not start with '{'");
  TempDir dir;
  EXPECT_NE(outcome(dir, safetensors_bytes("", {})).find("too short"), std::string::npos);
}

TEST(SafetensorsCorrupt, HeaderIsNotUtf8) {
  EXPECT_ERROR("{\"w\xff\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", {},
               "not valid JSON");
}

TEST(SafetensorsCorrupt, DuplicateTensorName) {
  EXPECT_ERROR(
      R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"w":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      k8, "tensor 'w' appears twice");
}

TEST(SafetensorsCorrupt, DuplicateFieldOfATensor) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","dtype":"I8","shape":[8],"data_offsets":[0,8]}})", k8,
               "key 'dtype' appears twice");
}

TEST(SafetensorsCorrupt, DuplicateMetadataKey) {
  EXPECT_ERROR(R"({"__metadata__":{"a":"1","a":"2"}})", {}, "key 'a' appears twice");
}

TEST(SafetensorsCorrupt, NestingDeeperThanTheFormat) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[[8]],"data_offsets":[0,8]}})", k8, "nests deeper");
  // Deep nesting is refused as it is parsed, not after building it.
  std::string deep = "{\"w\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  EXPECT_ERROR(deep, {}, "nests deeper");
  EXPECT_ERROR(R"({"__metadata__":{"a":{"b":["c"]}}})", {}, "nests deeper");
}

TEST(SafetensorsCorrupt, UnknownDtype) {
  EXPECT_ERROR(R"({"w":{"dtype":"F128","shape":[1],"data_offsets":[0,8]}})", k8,
               "tensor 'w' has an unknown dtype 'F128'");
  EXPECT_ERROR(R"({"w":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}})", k8,
               "unknown dtype 'f32'");
  EXPECT_ERROR(R"({"w":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", k8,
               "dtype that is not a string");
}

TEST(SafetensorsCorrupt, UnknownOrMissingField) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8],"data_offset":[0,8]}})", k8,
               "unknown field 'data_offset'");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8]}})", k8, "tensor 'w' has no data_offsets");
  EXPECT_ERROR(R"({"w":{"shape":[8],"data_offsets":[0,8]}})", k8, "tensor 'w' has no dtype");
  EXPECT_ERROR(R"({"w":[1,2]})", k8, "tensor 'w' must be an object");
}

TEST(SafetensorsCorrupt, ShapeIsNotNonNegativeIntegers) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[-8],"data_offsets":[0,8]}})", k8,
               "shape[0] must be a non-negative integer");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[2,4.0],"data_offsets":[0,8]}})", k8,
               "shape[1] must be a non-negative integer");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,8]}})", k8,
               "shape[0]");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":"8","data_offsets":[0,8]}})", k8,
               "shape that is not an array");
}

TEST(SafetensorsCorrupt, ShapeOverflows) {
  EXPECT_ERROR(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", k8,
               "tensor 'w' has a shape too large");
  // A zero does not hide the overflow of the other dims.
  EXPECT_ERROR(
      R"({"w":{"dtype":"F32","shape":[0,1099511627776,1099511627776],"data_offsets":[0,0]}})", {},
      "tensor 'w' has a shape too large");
  // Nor does it when the element count fits but its bits do not.
  EXPECT_ERROR(R"({"w":{"dtype":"F64","shape":[2305843009213693952],"data_offsets":[0,8]}})", k8,
               "has a shape too large");
}

TEST(SafetensorsCorrupt, DataOffsetsAreNotAPairOfIntegers) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0]}})", k8,
               "it must be [begin, end]");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8,8]}})", k8,
               "it must be [begin, end]");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":[0,-8]}})", k8,
               "data_offsets[1] must be a non-negative");
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[8],"data_offsets":{"a":0}}})", k8,
               "it must be [begin, end]");
}

TEST(SafetensorsCorrupt, OffsetsEndBeforeTheyBegin) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[8,0]}})", k8,
               "end before they begin");
}

TEST(SafetensorsCorrupt, OffsetsPastTheDataSection) {
  EXPECT_ERROR(R"({"w":{"dtype":"U8","shape":[16],"data_offsets":[0,16]}})", k8,
               "past the end of the data section (8 bytes)");
  EXPECT_ERROR(
      R"({"w":{"dtype":"U8","shape":[0],"data_offsets":[18446744073709551615,18446744073709551615]}})",
      k8, "past the end of the data section");
}

TEST(SafetensorsCorrupt, ByteRangeIsNotShapeTimesDtypeSize) {
  EXPECT_ERROR(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", k8,
               "tensor 'w' is F32 [3] (12 bytes) but data_offsets [0, 8] hold 8 bytes");
  EXPECT_ERROR(R"({"w":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", k8,
               "not a whole number of bytes");
}

TEST(SafetensorsCorrupt, TensorsOverlap) {
  EXPECT_ERROR(
      R"({"a":{"dtype":"U8","shape":[6],"data_offsets":[0,6]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      k8, "tensors 'a' [0, 6) and 'b' [4, 8) overlap");
  EXPECT_ERROR(
      R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
      k8, "overlap");
}

TEST(SafetensorsCorrupt, GapInTheDataSection) {
  EXPECT_ERROR(
      R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})",
      k8, "gap: bytes [2, 4) before tensor 'b' belong to no tensor");
  EXPECT_ERROR(R"({"b":{"dtype":"U8","shape":[4],"data_offsets":[4,8]}})", k8, "gap: bytes [0, 4)");
}

TEST(SafetensorsCorrupt, DataSectionLongerThanItsTensors) {
  EXPECT_ERROR(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}})", k8,
               "the data section has 8 bytes but the tensors cover only the first 4");
  EXPECT_ERROR(R"({})", k8, "cover only the first 0");
}

TEST(SafetensorsCorrupt, MetadataIsNotStrings) {
  EXPECT_ERROR(R"({"__metadata__":{"epoch":3}})", {},
               "__metadata__ 'epoch' must be a string, got 3");
  EXPECT_ERROR(R"({"__metadata__":["a"]})", {}, "__metadata__ must be an object of strings");
}

TEST(SafetensorsCorrupt, ZeroSizeTensorsAreValid) {
  TempDir dir;
  const std::string h =
      R"({"e":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"w":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},)"
      R"("z":{"dtype":"I64","shape":[5,0],"data_offsets":[8,8]}})";
  EXPECT_EQ(outcome(dir, safetensors_bytes(pad8(h), k8)), "");
}

TEST(SafetensorsCorrupt, TruncatedAtEveryByteFails) {
  TempDir dir;
  const std::vector<uint8_t> full = good_file();
  for (size_t len = 0; len < full.size(); ++len) {
    const std::vector<uint8_t> cut(full.begin(), full.begin() + long(len));
    EXPECT_NE(outcome(dir, cut, "cut to " + std::to_string(len)), "")
        << "cut to " << len << " loaded";
  }
}

TEST(SafetensorsCorrupt, ThousandsOfSeededByteChangesNeverCrash) {
  TempDir dir;
  const std::vector<uint8_t> full = good_file();
  std::mt19937_64 rng(2024);
  int errors = 0;
  const int n = 3000;
  for (int v = 0; v < n; ++v) {
    std::vector<uint8_t> bytes = full;
    const int changes = 1 + int(rng() % 3);
    for (int c = 0; c < changes; ++c) {
      const size_t pos =
          rng() % 8 ? size_t(rng() % (full.size() - 24)) : size_t(rng() % full.size());
      if (v % 2) bytes[pos] ^= uint8_t(1u << (rng() % 8));
      else bytes[pos] = uint8_t(rng());
    }
    errors += outcome(dir, bytes, "variant " + std::to_string(v)) != "";
  }
  EXPECT_GT(errors, n / 2);  // most header damage is detected
}
