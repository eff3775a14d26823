// Broken GGUF model files: one kiln::Error naming the file and the metadata key
// or tensor at fault.
#include <functional>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

// A GGUF of the fixture `name`, rewritten through `edit_meta` (may change or drop
// keys: return false to drop) and `keep_tensor`.
struct BrokenGguf {
  kiln_test::TempDir tmp;
  std::string path;
  BrokenGguf(const std::string& name,
             const std::function<bool(const std::string&, GgufValue&)>& edit_meta,
             const std::function<bool(const std::string&)>& keep_tensor = {}) {
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::load_pretrained(ctx, cpu, fixture_dir(name));
    models::save_gguf(*model, tmp.file("good.gguf"));
    GgufFile good(tmp.file("good.gguf"));
    GgufWriter w;
    for (auto [key, v] : good.metadata())
      if (edit_meta(key, v)) w.set(key, v);
    for (const GgufTensorInfo& t : good.tensors()) {
      if (keep_tensor && !keep_tensor(t.name)) continue;
      const std::vector<uint8_t> b = good.read_bytes(t.name);
      w.add_tensor_data(t.name, t.dtype, t.shape, b);
    }
    path = tmp.file("model.gguf");
    w.save(path);
  }
  std::string load() const {
    Context ctx;
    CpuBackend cpu(1);
    return kiln_test::error_message([&] { models::load_gguf(ctx, cpu, path); });
  }
};

auto keep_all = [](const std::string&, GgufValue&) { return true; };

TEST(ModelGgufErrors, UnknownArchitecture) {
  BrokenGguf b("llama3_gqa", [](const std::string& k, GgufValue& v) {
    if (k == "general.architecture") v = GgufValue("falcon");
    return true;
  });
  EXPECT_TRUE(
      kiln_test::is_error(b.load(), "models", {"model.gguf", "general.architecture", "falcon"}));
}

TEST(ModelGgufErrors, UnsupportedMetadataIsNamed) {
  BrokenGguf b("llama3_gqa", [](const std::string& k, GgufValue& v) {
    if (k == "llama.rope.freq_base") v = GgufValue(10000.0f);
    return true;
  });
  // Added key: a mixture of experts.
  GgufFile f(b.path);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  w.set("llama.expert_count", uint32_t(8));
  for (const GgufTensorInfo& t : f.tensors())
    w.add_tensor_data(t.name, t.dtype, t.shape, f.read_bytes(t.name));
  w.save(b.path);
  EXPECT_TRUE(kiln_test::is_error(b.load(), "models", {"model.gguf", "'llama.expert_count'"}));
}

// rope.scaling.type: none loads; a type kiln does not apply, and yarn without
// its factor, are refused naming the key.
TEST(ModelGgufErrors, RopeScalingTypes) {
  BrokenGguf b("mistral_swa", keep_all);
  GgufFile f(b.path);
  for (const char* type : {"none", "longrope", "xpos", "yarn"}) {
    GgufWriter w;
    for (const auto& [k, v] : f.metadata()) w.set(k, v);
    w.set("llama.rope.scaling.type", type);
    for (const GgufTensorInfo& t : f.tensors())
      w.add_tensor_data(t.name, t.dtype, t.shape, f.read_bytes(t.name));
    w.save(b.tmp.file(std::string(type) + ".gguf"));
    Context ctx;
    CpuBackend cpu(1);
    const std::string msg = kiln_test::error_message(
        [&] { models::load_gguf(ctx, cpu, b.tmp.file(std::string(type) + ".gguf")); });
    const std::string t = type;
    if (t == "none") {
      EXPECT_EQ(msg, "<no exception>");
    } else if (t == "yarn") {
      EXPECT_TRUE(kiln_test::is_error(msg, "models", {"yarn.gguf", "llama.rope.scaling.factor"}));
    } else {
      const std::string file = t + ".gguf", quoted = "'" + t + "'";
      EXPECT_TRUE(kiln_test::is_error(msg, "models",
                                      {file.c_str(), "llama.rope.scaling.type", quoted.c_str()}));
    }
  }
}

// Keys of llama.cpp's YaRN that kiln does not apply are refused by name.
TEST(ModelGgufErrors, YarnKeysKilnDoesNotApply) {
  BrokenGguf b("mistral_swa", keep_all);
  GgufFile f(b.path);
  GgufWriter w;
  for (const auto& [k, v] : f.metadata()) w.set(k, v);
  w.set("llama.rope.scaling.type", "yarn");
  w.set("llama.rope.scaling.factor", 4.0f);
  w.set("llama.rope.scaling.yarn_log_multiplier", 0.1f);
  for (const GgufTensorInfo& t : f.tensors())
    w.add_tensor_data(t.name, t.dtype, t.shape, f.read_bytes(t.name));
  w.save(b.path);
  EXPECT_TRUE(kiln_test::is_error(b.load(), "models",
                                  {"model.gguf", "'llama.rope.scaling.yarn_log_multiplier'"}));
}

TEST(ModelGgufErrors, MissingMetadata) {
  BrokenGguf b("qwen2_bias",
               [](const std::string& k, GgufValue&) { return k != "qwen2.block_count"; });
  EXPECT_TRUE(
      kiln_test::is_error(b.load(), "models", {"model.gguf", "qwen2.block_count", "missing"}));
}

TEST(ModelGgufErrors, MissingTensor) {
  BrokenGguf b("mistral_swa", keep_all,
               [](const std::string& t) { return t != "blk.1.ffn_up.weight"; });
  EXPECT_TRUE(
      kiln_test::is_error(b.load(), "models", {"model.gguf", "'blk.1.ffn_up.weight'", "missing"}));
}

TEST(ModelGgufErrors, ShapeThatDisagreesWithTheMetadata) {
  BrokenGguf b("gpt2", [](const std::string& k, GgufValue& v) {
    if (k == "gpt2.feed_forward_length") v = GgufValue(uint32_t(64));
    return true;
  });
  EXPECT_TRUE(kiln_test::is_error(
      b.load(), "models", {"model.gguf", "'blk.0.ffn_up.weight'", "[128, 32]", "[64, 32]"}));
}

TEST(ModelGgufErrors, TensorTheModelDoesNotHave) {
  BrokenGguf b("llama3_gqa", [](const std::string& k, GgufValue& v) {
    if (k == "llama.block_count") v = GgufValue(uint32_t(1));
    return true;
  });
  EXPECT_TRUE(kiln_test::is_error(b.load(), "models", {"model.gguf", "'blk.1.", "not part of"}));
}

TEST(ModelGgufErrors, TruncatedFile) {
  BrokenGguf b("qwen3_qknorm_f16", keep_all);
  std::filesystem::resize_file(b.path, std::filesystem::file_size(b.path) / 2);
  EXPECT_TRUE(kiln_test::is_error(b.load(), "gguf", {"model.gguf"}));
}

}  // namespace
}  // namespace kiln::test
