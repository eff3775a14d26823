// safetensors: round trips of kiln's dtypes, the exact bytes kiln writes, files
// laid out as PyTorch's safetensors.torch.save_file writes them, every dtype of
// the spec, and the format-neutral state-dict API over both formats.
//
// CI has no PyTorch, so the "PyTorch" fixtures are built byte by byte in this
// file from the spec and from the reference writer's layout (the Rust crate
// behind safetensors.torch): "__metadata__" first, tensors sorted by dtype
// (widest first) and then name, so keys are not in sorted order; fields in the
// order dtype, shape, data_offsets; compact JSON padded with spaces to a
// multiple of 8 bytes.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "common/error_check.h"
#include "kiln/kiln.h"
#include "kiln/safetensors.h"
#include "kiln/state_dict.h"
#include "safetensors_test_util.h"

using namespace kiln;
using kiln_test::TempDir;

namespace {

std::string write(const TempDir& dir, const std::vector<uint8_t>& bytes,
                  const std::string& name = "f.safetensors") {
  const std::string path = dir.file(name);
  kiln_test::write_file(path, bytes);
  return path;
}

// One tensor of every kiln dtype, a scalar and a zero-size tensor, with values.
struct SafetensorsModel {
  Context ctx;
  Tensor a, h, b, i, s;
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf;
  SafetensorsModel() {
    a = ctx.param(f32, {3, 4}, "a");
    h = ctx.param(f16, {2, 3, 5}, "h");
    b = ctx.param(bf16, {7}, "b");
    i = ctx.tensor(i32, {2, 2, 2, 2}, "i");
    s = ctx.tensor(f32, {}, "scalar");
    buf = allocate_tensors(ctx, cpu);
  }
  std::vector<NamedTensor> state() const {
    return {{"layers.0.a", a}, {"layers.0.h", h}, {"b", b}, {"idx", i}, {"scalar", s}};
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
  bool same_values(const SafetensorsModel& o) const {
    return a.get<float>() == o.a.get<float>() && h.get<uint16_t>() == o.h.get<uint16_t>() &&
           b.get<uint16_t>() == o.b.get<uint16_t>() && i.get<int32_t>() == o.i.get<int32_t>() &&
           s.get<float>() == o.s.get<float>();
  }
};

}  // namespace

TEST(Safetensors, RoundTripsEveryKilnDtype) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  SafetensorsModel m;
  m.fill(2.5f);
  const auto sd = m.state();
  save_safetensors(path, sd, {{"format", "pt"}, {"note", "kiln \"test\" é"}});

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"note", "kiln \"test\" é"}}));
  ASSERT_EQ(f.tensors().size(), 5u);
  const char* dtypes[] = {"F32", "F16", "BF16", "I32", "F32"};
  for (size_t k = 0; k < sd.size(); ++k) {
    const TensorInfo& t = f.tensors()[k];  // in the order written
    EXPECT_EQ(t.name, sd[k].name);
    EXPECT_EQ(t.file_dtype, dtypes[k]);
    EXPECT_EQ(t.dtype, sd[k].tensor.dtype());
    EXPECT_EQ(t.shape, sd[k].tensor.shape());
    EXPECT_TRUE(t.loadable());
  }
  EXPECT_EQ(f.header_size() % 8, 0u);
  EXPECT_EQ(f.data_offsets("layers.0.h"), (std::pair<uint64_t, uint64_t>{48, 108}));
  EXPECT_EQ(f.tensors()[4].dims, std::vector<int64_t>{});

  SafetensorsModel back;
  for (const NamedTensor& t : back.state()) f.read(t.name, t.tensor);
  EXPECT_TRUE(back.same_values(m));
  SafetensorsModel again;
  EXPECT_TRUE(load_safetensors(path, again.state()).empty());
  EXPECT_TRUE(again.same_values(m));
}

// The exact bytes: u64 length, compact JSON in the given order, spaces to 8, data.
TEST(Safetensors, WritesTheSpecLayoutByteForByte) {
  TempDir dir;
  Context ctx;
  Tensor w = ctx.tensor(f32, {2}, "w"), z = ctx.tensor(i32, {0, 3}, "z"),
         v = ctx.tensor(bf16, {1}, "v");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  w.set<float>({1.0f, -2.0f});
  v.set<uint16_t>({0x3f80});
  const std::string path = dir.file("x.safetensors");
  save_safetensors(path, std::vector<NamedTensor>{{"w", w}, {"z", z}, {"a", v}}, {{"k", "v"}});
  const std::string json =
      R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("z":{"dtype":"I32","shape":[0,3],"data_offsets":[8,8]},"a":{"dtype":"BF16","shape":[1],"data_offsets":[8,10]}})";
  std::vector<uint8_t> data;
  kiln_test::append<float>(data, {1.0f, -2.0f});
  kiln_test::append<uint16_t>(data, {0x3f80});
  EXPECT_EQ(kiln_test::read_file(path), kiln_test::safetensors_bytes(kiln_test::pad8(json), data));
  // No metadata: no "__metadata__" entry; no tensors: "{}".
  save_safetensors(path, std::vector<NamedTensor>{});
  EXPECT_EQ(kiln_test::read_file(path), kiln_test::safetensors_bytes("{}      ", {}));
  SafetensorsFile f(path);
  EXPECT_TRUE(f.tensors().empty());
  EXPECT_TRUE(f.metadata().empty());
}

// A file as safetensors.torch.save_file({"z.weight": f32 [2, 2], "m.idx": i32
// [3], "a.bias": f16 [2]}, path, metadata={"format": "pt"}) lays it out.
TEST(Safetensors, ReadsAFileLaidOutAsPyTorchWritesIt) {
  TempDir dir;
  const std::string json =
      R"({"__metadata__":{"format":"pt"},"z.weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
      R"("m.idx":{"dtype":"I32","shape":[3],"data_offsets":[16,28]},)"
      R"("a.bias":{"dtype":"F16","shape":[2],"data_offsets":[28,32]}})";
  ASSERT_NE(json.size() % 8, 0u);  // so the padding is exercised
  std::vector<uint8_t> data;
  kiln_test::append<float>(data, {1.5f, -2.0f, 0.25f, 3.0f});
  kiln_test::append<int32_t>(data, {7, -1, 2147483647});
  kiln_test::append<uint16_t>(data, {0x3c00, 0xc000});
  const std::string path =
      write(dir, kiln_test::safetensors_bytes(kiln_test::pad8(json), data), "torch.safetensors");

  SafetensorsFile f(path);
  EXPECT_EQ(f.metadata().at("format"), "pt");
  ASSERT_EQ(f.tensors().size(), 3u);
  EXPECT_EQ(f.tensors()[0].name, "z.weight");  // the file's order, not sorted
  EXPECT_EQ(f.tensors()[2].name, "a.bias");
  Context ctx;
  Tensor w = ctx.param(f32, {2, 2}), idx = ctx.tensor(i32, {3}), bias = ctx.param(f16, {2});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  EXPECT_TRUE(load_safetensors(
                  path, std::vector<NamedTensor>{{"z.weight", w}, {"m.idx", idx}, {"a.bias", bias}})
                  .empty());
  EXPECT_EQ(w.get<float>(), (std::vector<float>{1.5f, -2.0f, 0.25f, 3.0f}));
  EXPECT_EQ(idx.get<int32_t>(), (std::vector<int32_t>{7, -1, 2147483647}));
  EXPECT_EQ(bias.get<uint16_t>(), (std::vector<uint16_t>{0x3c00, 0xc000}));  // 1.0, -2.0
  // Names with JSON escapes and non-ASCII characters.
  const std::string esc =
      kiln_test::pad8(R"({"caf\u00e9.w\"x":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})");
  SafetensorsFile g(write(dir, kiln_test::safetensors_bytes(esc, {9, 8}), "esc.safetensors"));
  ASSERT_EQ(g.tensors().size(), 1u);
  EXPECT_EQ(g.tensors()[0].name, "caf\xc3\xa9.w\"x");
  EXPECT_EQ(g.read_bytes("caf\xc3\xa9.w\"x"), (std::vector<uint8_t>{9, 8}));
}

// Every dtype of the spec parses; kiln's four load, the others give their raw
// bytes and a clear error when loaded into a tensor.
TEST(Safetensors, EveryDtypeOfTheSpecParses) {
  TempDir dir;
  struct D {
    const char* name;
    int bits;
  };
  const D all[] = {{"BOOL", 8},    {"U8", 8},   {"I8", 8},      {"F8_E5M2", 8}, {"F8_E4M3", 8},
                   {"F8_E8M0", 8}, {"F4", 4},   {"F6_E2M3", 6}, {"F6_E3M2", 6}, {"I16", 16},
                   {"U16", 16},    {"F16", 16}, {"BF16", 16},   {"I32", 32},    {"U32", 32},
                   {"F32", 32},    {"F64", 64}, {"I64", 64},    {"U64", 64},    {"C64", 64}};
  std::string json = "{";
  std::vector<uint8_t> data;
  for (const D& d : all) {
    const uint64_t nbytes = 4 * uint64_t(d.bits) / 8;  // shape [4]
    if (json.size() > 1) json += ",";
    json += std::string("\"t_") + d.name + "\":{\"dtype\":\"" + d.name +
            "\",\"shape\":[4],\"data_offsets\":[" + std::to_string(data.size()) + "," +
            std::to_string(data.size() + nbytes) + "]}";
    for (uint64_t k = 0; k < nbytes; ++k) data.push_back(uint8_t(data.size() * 7));
  }
  json += "}";
  const std::string path = write(dir, kiln_test::safetensors_bytes(kiln_test::pad8(json), data));
  SafetensorsFile f(path);
  ASSERT_EQ(f.tensors().size(), std::size(all));
  Context ctx;
  Tensor t = ctx.tensor(f32, {4}, "t");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  uint64_t at = 0;
  for (const D& d : all) {
    const std::string name = std::string("t_") + d.name;
    const TensorInfo* info = f.find(name);
    ASSERT_NE(info, nullptr) << name;
    EXPECT_EQ(info->file_dtype, d.name);
    EXPECT_EQ(info->dims, std::vector<int64_t>{4});
    EXPECT_EQ(info->nbytes, 4u * d.bits / 8);
    const std::vector<uint8_t> raw = f.read_bytes(name);
    EXPECT_EQ(
        raw, std::vector<uint8_t>(data.begin() + long(at), data.begin() + long(at + info->nbytes)));
    at += info->nbytes;
    const bool kiln_has = std::string(d.name) == "F32" || std::string(d.name) == "F16" ||
                          std::string(d.name) == "BF16" || std::string(d.name) == "I32";
    EXPECT_EQ(info->loadable(), kiln_has) << name;
    if (!kiln_has)
      EXPECT_EQ(kiln_test::error_message([&] { f.read(name, t); }),
                "[safetensors] " + path + ": cannot load tensor '" + name + "': dtype " + d.name +
                    " is not supported by kiln (kiln tensors load F32, F16, BF16 and I32; "
                    "read_bytes() gives "
                    "the raw data)");
  }
  f.read("t_F32", t);
  std::vector<float> want(4);
  std::memcpy(want.data(), f.read_bytes("t_F32").data(), 16);
  EXPECT_EQ(t.get<float>(), want);
}

TEST(Safetensors, MoreThanFourDimsParsesButDoesNotLoad) {
  TempDir dir;
  const std::string json = R"({"t":{"dtype":"F32","shape":[1,1,1,1,2],"data_offsets":[0,8]}})";
  const std::string path =
      write(dir, kiln_test::safetensors_bytes(kiln_test::pad8(json), std::vector<uint8_t>(8)));
  SafetensorsFile f(path);
  EXPECT_EQ(f.tensors()[0].dims, (std::vector<int64_t>{1, 1, 1, 1, 2}));
  EXPECT_FALSE(f.tensors()[0].loadable());
  Context ctx;
  Tensor t = ctx.tensor(f32, {2});
  EXPECT_NE(kiln_test::error_message([&] {
              f.check("t", t);
            }).find("has 5 dims; kiln tensors have at most 4"),
            std::string::npos);
}

TEST(Safetensors, LoadChecksEveryTensorBeforeWritingAny) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  SafetensorsModel m;
  m.fill(1.0f);
  save_safetensors(path, m.state());
  SafetensorsModel target;
  target.fill(9.0f);
  SafetensorsModel snapshot;
  snapshot.fill(9.0f);
  // Wrong shape for the last tensor: nothing is loaded, the error names it.
  Context ctx;
  Tensor wrong = ctx.tensor(f32, {1});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  auto sd = target.state();
  sd.back().tensor = wrong;
  EXPECT_EQ(kiln_test::error_message([&] { load_safetensors(path, sd); }),
            "[safetensors] " + path + ": tensor 'scalar' is F32 [] in the file but target " +
                wrong.label() + " is f32 [1]");
  EXPECT_TRUE(target.same_values(snapshot));
  // A name the file lacks, a dtype that differs, a tensor without memory.
  sd = target.state();
  sd.push_back({"missing", wrong});
  EXPECT_EQ(kiln_test::error_message([&] { load_safetensors(path, sd); }),
            "[safetensors] " + path + ": no tensor named 'missing' (the file has 5 tensors)");
  sd = target.state();
  sd[0].name = "idx";
  EXPECT_NE(kiln_test::error_message([&] { load_safetensors(path, sd); })
                .find("tensor 'idx' is I32 [2, 2, 2, 2] in the file but target " +
                      sd[0].tensor.label() + " is f32 [3, 4]"),
            std::string::npos);
  Context unallocated;
  sd = target.state();
  sd[1].tensor = unallocated.tensor(f16, {2, 3, 5}, "h2");
  EXPECT_NE(kiln_test::error_message([&] {
              load_safetensors(path, sd);
            }).find("target " + sd[1].tensor.label() + " has no memory yet"),
            std::string::npos);
  EXPECT_TRUE(target.same_values(snapshot));
  // Tensors of the file that are not asked for are returned.
  sd = target.state();
  sd.erase(sd.begin() + 1);
  EXPECT_EQ(load_safetensors(path, sd), std::vector<std::string>{"layers.0.h"});
}

TEST(Safetensors, SaveRefusesBadInputAndLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  SafetensorsModel m;
  m.fill(1.0f);
  save_safetensors(path, m.state());
  const std::vector<uint8_t> before = kiln_test::read_file(path);
  Context ctx;
  Tensor none = ctx.tensor(f32, {2}, "none");  // no memory
  auto with = [&](std::vector<NamedTensor> extra) {
    auto sd = m.state();
    sd.insert(sd.end(), extra.begin(), extra.end());
    return kiln_test::error_message([&] { save_safetensors(path, sd); });
  };
  EXPECT_NE(with({{"", m.a}}).find("a tensor has an empty name"), std::string::npos);
  EXPECT_NE(with({{"b", m.a}}).find("tensor 'b' is given twice"), std::string::npos);
  EXPECT_NE(with({{"__metadata__", m.a}}).find("cannot be named __metadata__"), std::string::npos);
  EXPECT_NE(with({{"none", none}}).find("tensor 'none' [2] has no data"), std::string::npos);
  EXPECT_NE(with({{"bad\xff", m.a}}).find("UTF-8"), std::string::npos);
  EXPECT_EQ(kiln_test::read_file(path), before);
  for (const std::string& e : dir.entries()) EXPECT_EQ(e.find(".tmp-"), std::string::npos) << e;
}

// ---- the format-neutral API over both formats ----

TEST(StateDict, RoundTripsInBothFormats) {
  TempDir dir;
  for (const char* ext : {".safetensors", ".gguf", ".SafeTensors"}) {
    const std::string path = dir.file(std::string("m") + ext);
    SafetensorsModel m;
    m.fill(3.0f);
    save_state_dict(path, m.state(), {{"epoch", "3"}, {"model", "test"}});
    auto f = open_state_dict(path);
    EXPECT_EQ(f->path(), path);
    EXPECT_EQ(f->metadata().at("epoch"), "3");
    EXPECT_EQ(f->metadata().at("model"), "test");
    ASSERT_EQ(f->tensors().size(), 5u);
    for (const NamedTensor& t : m.state()) {
      const TensorInfo* info = f->find(t.name);
      ASSERT_NE(info, nullptr) << ext << " " << t.name;
      EXPECT_EQ(info->dtype, t.tensor.dtype());
      EXPECT_EQ(info->nbytes, uint64_t(t.tensor.numel()) * dtype_size(t.tensor.dtype()));
      EXPECT_TRUE(info->loadable());
    }
    EXPECT_EQ(f->find("nope"), nullptr);
    SafetensorsModel back;
    EXPECT_TRUE(load_state_dict(path, back.state()).empty()) << ext;
    EXPECT_TRUE(back.same_values(m)) << ext;
    SafetensorsModel one;
    one.fill(0.0f);
    f->check("layers.0.a", one.a);
    f->read("layers.0.a", one.a);
    EXPECT_EQ(one.a.get<float>(), m.a.get<float>());
    EXPECT_EQ(f->read_bytes("idx").size(), 64u);
  }
}

TEST(StateDict, UnknownExtensionNamesTheSupportedOnes) {
  SafetensorsModel m;
  const std::string want =
      "[state_dict] model.pt: unknown model file extension; kiln reads and writes .safetensors and "
      ".gguf";
  EXPECT_EQ(kiln_test::error_message([&] { open_state_dict("model.pt"); }), want);
  EXPECT_EQ(kiln_test::error_message([&] { save_state_dict("model.pt", m.state()); }), want);
}

TEST(StateDict, ErrorsNameTheFileAndTheTensor) {
  TempDir dir;
  for (const char* ext : {".safetensors", ".gguf"}) {
    const std::string path = dir.file(std::string("m") + ext);
    SafetensorsModel m;
    m.fill(1.0f);
    save_state_dict(path, m.state());
    auto f = open_state_dict(path);
    const std::string e = kiln_test::error_message([&] { f->check("layers.0.a", m.h); });
    EXPECT_NE(e.find(path), std::string::npos) << e;
    EXPECT_NE(e.find("'layers.0.a'"), std::string::npos) << e;
    const std::string missing = kiln_test::error_message([&] { f->read("nope", m.a); });
    EXPECT_NE(missing.find(path), std::string::npos) << missing;
    EXPECT_NE(missing.find("'nope'"), std::string::npos) << missing;
  }
}
