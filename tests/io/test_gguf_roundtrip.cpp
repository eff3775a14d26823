// GGUF round trips (tensors of every dtype, metadata of every type), the byte
// layout against a hand-built file, and clear errors on misuse.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/error_check.h"
#include "gguf_test_util.h"
#include "kiln/io.h"
#include "kiln/kiln.h"

using namespace kiln;
using kiln_test::Bytes;
using kiln_test::TempDir;

namespace {

std::vector<std::pair<std::string, GgufValue>> all_metadata() {
  std::vector<std::pair<std::string, GgufValue>> kv;
  kv.emplace_back("t.u8", GgufValue(uint8_t(200)));
  kv.emplace_back("t.i8", GgufValue(int8_t(-100)));
  kv.emplace_back("t.u16", GgufValue(uint16_t(60000)));
  kv.emplace_back("t.i16", GgufValue(int16_t(-30000)));
  kv.emplace_back("t.u32", GgufValue(uint32_t(4000000000u)));
  kv.emplace_back("t.i32", GgufValue(int32_t(-2000000000)));
  kv.emplace_back("t.u64", GgufValue(uint64_t(1) << 63));
  kv.emplace_back("t.i64", GgufValue(int64_t(-1) << 62));
  kv.emplace_back("t.f32", GgufValue(1.5f));
  kv.emplace_back("t.f64", GgufValue(-2.25e100));
  kv.emplace_back("t.bool", GgufValue(true));
  kv.emplace_back("t.string", GgufValue("hello gguf"));
  kv.emplace_back("t.empty_string", GgufValue(""));
  kv.emplace_back("t.arr_u8", GgufValue(std::vector<uint8_t>{1, 2, 255}));
  kv.emplace_back("t.arr_i8", GgufValue(std::vector<int8_t>{-1, 2}));
  kv.emplace_back("t.arr_u16", GgufValue(std::vector<uint16_t>{7}));
  kv.emplace_back("t.arr_i16", GgufValue(std::vector<int16_t>{-7, 8}));
  kv.emplace_back("t.arr_u32", GgufValue(std::vector<uint32_t>{1, 2, 3}));
  kv.emplace_back("t.arr_i32", GgufValue(std::vector<int32_t>{-1, 0, 1}));
  kv.emplace_back("t.arr_u64", GgufValue(std::vector<uint64_t>{10, 20}));
  kv.emplace_back("t.arr_i64", GgufValue(std::vector<int64_t>{-10, 20, -30}));
  kv.emplace_back("t.arr_f32", GgufValue(std::vector<float>{0.5f, -1.0f}));
  kv.emplace_back("t.arr_f64", GgufValue(std::vector<double>{3.25}));
  kv.emplace_back("t.arr_bool", GgufValue(std::vector<bool>{true, false, true}));
  kv.emplace_back("t.arr_string", GgufValue(std::vector<std::string>{"a", "", "ccc"}));
  kv.emplace_back("t.arr_empty", GgufValue(std::vector<int32_t>{}));
  kv.emplace_back("t.arr_nested", GgufValue::array_of({GgufValue(std::vector<int32_t>{1, 2}),
                                                       GgufValue(std::vector<std::string>{"x"})}));
  return kv;
}

struct Model {
  Context ctx;
  Tensor a, h, b, i, s;
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf;
  Model() {
    a = ctx.param(f32, {3, 4}, "a");
    h = ctx.param(f16, {2, 3, 5}, "h");
    b = ctx.param(bf16, {7}, "b");
    i = ctx.tensor(i32, {2, 2, 2, 2}, "i");
    s = ctx.tensor(f32, {}, "scalar");
    buf = allocate_tensors(ctx, cpu);
  }
  void fill(float seed) {
    std::vector<float> va(12);
    for (size_t k = 0; k < va.size(); ++k) va[k] = seed + 0.25f * float(k) - 1.0f;
    a.set(va);
    std::vector<uint16_t> vh(30), vb(7);
    for (size_t k = 0; k < vh.size(); ++k) vh[k] = f32_to_f16(seed * float(k) / 7.0f);
    for (size_t k = 0; k < vb.size(); ++k) vb[k] = f32_to_bf16(seed - float(k) * 3.0f);
    h.set(vh);
    b.set(vb);
    std::vector<int32_t> vi(16);
    for (size_t k = 0; k < vi.size(); ++k) vi[k] = int32_t(k * k) - int32_t(seed * 10);
    i.set(vi);
    s.set<float>({seed});
  }
};

}  // namespace

TEST(Gguf, RoundTripsTensorsOfEveryDtypeAndAllMetadataTypes) {
  TempDir dir;
  const std::string path = dir.file("m.gguf");
  Model m;
  m.fill(2.5f);
  GgufWriter w;
  for (auto& [k, v] : all_metadata()) w.set(k, v);
  for (Tensor t : {m.a, m.h, m.b, m.i, m.s}) w.add_tensor(t);
  w.save(path);

  GgufFile f(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  auto expected = all_metadata();
  ASSERT_EQ(f.metadata().size(), expected.size());
  for (size_t k = 0; k < expected.size(); ++k) {
    EXPECT_EQ(f.metadata()[k].first, expected[k].first);
    EXPECT_TRUE(f.metadata()[k].second == expected[k].second) << expected[k].first;
  }
  EXPECT_EQ(f.get("t.u64").as_uint(), uint64_t(1) << 63);
  EXPECT_THROW(f.get("t.u64").as_int(), Error);  // does not fit
  EXPECT_EQ(f.get("t.i8").as_int(), -100);
  EXPECT_EQ(f.get("t.f64").as_float(), -2.25e100);
  EXPECT_EQ(f.get("t.string").as_string(), "hello gguf");
  EXPECT_EQ(f.get("t.arr_i64").as_ints(), (std::vector<int64_t>{-10, 20, -30}));
  EXPECT_EQ(f.get("t.arr_f32").as_floats(), (std::vector<double>{0.5, -1.0}));
  EXPECT_EQ(f.get("t.arr_string").as_strings(), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f.get("t.arr_nested").as_arrays().at(1).as_strings().at(0), "x");
  EXPECT_TRUE(f.get("t.bool").as_bool());

  ASSERT_EQ(f.tensors().size(), 5u);
  EXPECT_EQ(f.tensor_info("h").shape, Shape({2, 3, 5}));
  EXPECT_EQ(f.tensor_info("h").dtype, f16);
  EXPECT_EQ(f.tensor_info("b").ggml_type, 30u);
  EXPECT_EQ(f.tensor_info("i").ggml_type, 26u);
  EXPECT_EQ(f.tensor_info("scalar").shape, Shape({1}));  // ggml has no 0-dim tensors
  for (const GgufTensorInfo& t : f.tensors()) EXPECT_EQ((t.offset - f.data_offset()) % 32, 0u);

  Model back;
  back.fill(-9.0f);
  for (Tensor t : {back.a, back.h, back.b, back.i, back.s}) f.load(t);
  EXPECT_EQ(back.a.get<float>(), m.a.get<float>());
  EXPECT_EQ(back.h.get<uint16_t>(), m.h.get<uint16_t>());
  EXPECT_EQ(back.b.get<uint16_t>(), m.b.get<uint16_t>());
  EXPECT_EQ(back.i.get<int32_t>(), m.i.get<int32_t>());
  EXPECT_EQ(back.s.item(), 2.5f);
  std::vector<uint8_t> raw = f.read_bytes("a");
  ASSERT_EQ(raw.size(), 48u);
  float first;
  std::memcpy(&first, raw.data(), 4);
  EXPECT_EQ(first, 1.5f);
}

TEST(Gguf, CustomAlignmentAndRawTensorData) {
  TempDir dir;
  for (uint32_t align : {1u, 8u, 64u, 4096u}) {
    const std::string path = dir.file("a" + std::to_string(align) + ".gguf");
    GgufWriter w;
    w.set_alignment(align);
    std::vector<int32_t> v{1, 2, 3, 4, 5, 6};
    std::vector<uint8_t> bytes(v.size() * 4);
    std::memcpy(bytes.data(), v.data(), bytes.size());
    w.add_tensor_data("x", i32, {2, 3}, bytes);
    w.add_tensor_data("y", i32, {3}, std::span<const uint8_t>(bytes).first(12));
    w.save(path);
    GgufFile f(path);
    EXPECT_EQ(f.alignment(), align);
    EXPECT_EQ(f.get("general.alignment").as_uint(), align);
    EXPECT_EQ(f.read_bytes("x"), bytes);
    EXPECT_EQ(f.tensor_info("y").offset % align, 0u);
    EXPECT_EQ(f.read_bytes("y"), std::vector<uint8_t>(bytes.begin(), bytes.begin() + 12));
  }
}

// A file built byte by byte from the spec: dims are stored innermost first, the
// data section starts at the next multiple of the alignment, offsets are
// relative to it.
TEST(Gguf, ReadsAHandBuiltFileWithInnermostFirstDims) {
  TempDir dir;
  Bytes b;
  b.header(2, 2).str("general.architecture").u32(8).str("test");
  b.str("general.alignment").u32(4).u32(16);
  b.tensor("w", {3, 2}, 0, 0);  // ggml ne = [3, 2]: kiln [2, 3]
  b.tensor("v", {4}, 26, 32);   // i32 [4] at data offset 32
  b.pad(16);
  const size_t data_start = b.size();
  for (int k = 0; k < 6; ++k) b.f32(float(k));
  b.pad(16);  // 24 bytes of w, padded: v starts at data offset 32
  for (int k = 0; k < 4; ++k) b.u32(uint32_t(100 + k));
  const std::string path = dir.file("hand.gguf");
  kiln_test::write_file(path, b.b);

  GgufFile f(path);
  EXPECT_EQ(f.alignment(), 16u);
  EXPECT_EQ(f.data_offset(), data_start);
  EXPECT_EQ(f.get("general.architecture").as_string(), "test");
  EXPECT_EQ(f.tensor_info("w").shape, Shape({2, 3}));
  EXPECT_EQ(f.tensor_info("v").offset, data_start + 32);
  Context ctx;
  Tensor w = ctx.tensor(f32, {2, 3}, "w");
  Tensor v = ctx.tensor(i32, {1, 4}, "v");  // leading 1: still matches [4]
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  f.load(w);
  f.load(v);
  EXPECT_EQ(w.get<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(v.get<int32_t>(), (std::vector<int32_t>{100, 101, 102, 103}));

  // kiln's writer produces the same layout for the same content.
  GgufWriter wr;
  wr.set("general.architecture", "test");
  wr.set_alignment(16);
  wr.add_tensor(w);
  std::vector<uint8_t> vb(16);
  for (int k = 0; k < 4; ++k) {
    uint32_t x = uint32_t(100 + k);
    std::memcpy(vb.data() + 4 * k, &x, 4);
  }
  wr.add_tensor_data("v", i32, {4}, vb);
  const std::string mine = dir.file("mine.gguf");
  wr.save(mine);
  std::vector<uint8_t> got = kiln_test::read_file(mine);
  EXPECT_EQ(got, b.b);
}

TEST(Gguf, LoadChecksNamesDtypesShapesAndMemory) {
  TempDir dir;
  const std::string path = dir.file("c.gguf");
  Model m;
  m.fill(1.0f);
  GgufWriter w;
  w.add_tensor(m.a);
  w.add_tensor(m.h, "renamed");
  w.save(path);
  GgufFile f(path);
  Context ctx;
  Tensor wrong_dtype = ctx.tensor(f16, {3, 4}, "a");
  Tensor wrong_shape = ctx.tensor(f32, {4, 3}, "a");
  Tensor missing = ctx.tensor(f32, {3, 4}, "nope");
  Tensor no_memory = ctx.tensor(f32, {3, 4}, "a");
  std::string no_mem = kiln_test::error_message([&] { f.load(no_memory); });
  EXPECT_NE(no_mem.find("no memory"), std::string::npos) << no_mem;
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  std::string e1 = kiln_test::error_message([&] { f.load(wrong_dtype); });
  EXPECT_EQ(e1.rfind("[gguf] " + path + ": tensor 'a' is f32 [3, 4] in the file but", 0), 0u) << e1;
  EXPECT_NE(e1.find("f16 [3, 4]"), std::string::npos) << e1;
  std::string e2 = kiln_test::error_message([&] { f.load(wrong_shape); });
  EXPECT_NE(e2.find("[4, 3]"), std::string::npos) << e2;
  std::string e3 = kiln_test::error_message([&] { f.load(missing); });
  EXPECT_NE(e3.find("no tensor named 'nope'"), std::string::npos) << e3;
  EXPECT_THROW(f.get("missing.key"), Error);
  EXPECT_EQ(f.find("missing.key"), nullptr);
  Tensor h2 = ctx.tensor(f16, {2, 3, 5});
  auto buf2 = allocate_tensors(ctx, cpu);
  f.load(h2, "renamed");
  EXPECT_EQ(h2.get<uint16_t>(), m.h.get<uint16_t>());
}

TEST(Gguf, WriterRejectsBadNamesKeysAndAlignment) {
  Context ctx;
  Tensor unnamed = ctx.tensor(f32, {2});
  Tensor a = ctx.tensor(f32, {2}, "a");
  GgufWriter w;
  EXPECT_THROW(w.add_tensor(unnamed), Error);
  EXPECT_THROW(w.add_tensor(a, std::string(64, 'x')), Error);  // ggml allows 63 bytes
  w.add_tensor(a, std::string(63, 'x'));
  w.add_tensor(a);
  EXPECT_THROW(w.add_tensor(a), Error);  // twice under one name
  EXPECT_THROW(w.add_tensor_data("raw", f32, {3}, std::vector<uint8_t>(8)), Error);
  EXPECT_THROW(w.set("", GgufValue(1)), Error);
  EXPECT_THROW(w.set("general.alignment", GgufValue(int32_t(32))), Error);  // must be u32
  EXPECT_THROW(w.set_alignment(0), Error);
  EXPECT_THROW(w.set_alignment(24), Error);
  EXPECT_THROW(GgufValue::array_of({GgufValue(1)}), Error);
  w.set("k", GgufValue(1));
  w.set("k", GgufValue("replaced"));
  ASSERT_EQ(w.metadata().size(), 1u);
  EXPECT_EQ(w.metadata()[0].second.as_string(), "replaced");
}

TEST(Gguf, ValueConversionsAreCheckedAndPrintable) {
  EXPECT_EQ(GgufValue(uint8_t(7)).as_int(), 7);
  EXPECT_EQ(GgufValue(int16_t(-3)).as_float(), -3.0);
  EXPECT_THROW(GgufValue(int16_t(-3)).as_uint(), Error);
  EXPECT_THROW(GgufValue(1.5f).as_int(), Error);
  EXPECT_THROW(GgufValue("s").as_float(), Error);
  EXPECT_THROW(GgufValue(1).as_string(), Error);
  EXPECT_THROW(GgufValue(std::vector<float>{1}).as_ints(), Error);
  EXPECT_THROW(GgufValue(std::vector<int32_t>{1}).as_strings(), Error);
  EXPECT_EQ(GgufValue(std::vector<int32_t>{1, 2}).str(), "[1, 2]");
  EXPECT_EQ(GgufValue("x").str(), "\"x\"");
  EXPECT_EQ(GgufValue(std::vector<uint8_t>(20, 1)).str().find("(20 total)") != std::string::npos,
            true);
  EXPECT_EQ(GgufValue(std::vector<int32_t>{1, 2}).size(), 2u);
  EXPECT_EQ(GgufValue(std::vector<int32_t>{1, 2}).elem_type(), GgufType::i32);
}
