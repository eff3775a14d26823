// Loading: models::load picks the loader from the path; loading is linear in
// the number of tensors (a Llama of 2300 tiny layers, 20702 tensors, as a
// Hugging Face directory and as GGUF: the times are printed, not asserted);
// and a layer count the files cannot fill fails before any module is built.
#include <chrono>
#include <cstdio>
#include <fstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "llama_shape.h"  // bench/: tiny_llama
#include "models_test_util.h"

namespace kiln::test {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Writes a tiny_llama(layers) with random weights as `dir` (HF) and `gguf`.
void save_tiny(int64_t layers, const std::string& dir, const std::string& gguf) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::make_model(ctx, bench::tiny_llama(layers), {.max_seq_len = 4});
  model->allocate(cpu);
  model->init(7);
  if (!dir.empty()) models::save_pretrained(*model, dir);
  if (!gguf.empty()) models::save_gguf(*model, gguf);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(ModelLoad, PathChoosesTheLoader) {
  kiln_test::TempDir tmp;
  save_tiny(2, tmp.file("hf"), tmp.file("model.gguf"));
  for (const std::string& path : {tmp.file("hf"), tmp.file("model.gguf")}) {
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::load(ctx, cpu, path, {.max_seq_len = 4});
    EXPECT_EQ(model->config().model_type, "llama") << path;
    EXPECT_EQ(model->named_parameters().size(), size_t(2 * 9 + 2)) << path;
  }
  // A GGUF file whatever its name; a file that is not one is named as such.
  std::filesystem::copy_file(tmp.file("model.gguf"), tmp.file("weights.bin"));
  std::ofstream(tmp.file("notes.txt")) << "not a model";
  Context ctx;
  CpuBackend cpu(1);
  EXPECT_EQ(models::load(ctx, cpu, tmp.file("weights.bin"))->config().model_type, "llama");
  EXPECT_KILN_ERROR(models::load(ctx, cpu, tmp.file("notes.txt")), "models", "notes.txt",
                    "not a GGUF file", "Hugging Face model directory");
  EXPECT_KILN_ERROR(models::load(ctx, cpu, tmp.file("absent")), "models", "absent",
                    "no such file or directory");
  // A directory goes to the Hugging Face loader, whose errors name what it lacks.
  std::filesystem::create_directory(tmp.file("empty"));
  EXPECT_KILN_ERROR(models::load(ctx, cpu, tmp.file("empty")), "models", "config.json");
}

// 20702 tensors load in about a second (the module tree's lookups and the
// loaders' checks hashed; one tree walk to change every dtype): 16k layers took
// 9.8 s when each tensor's lookup scanned a list.
TEST(ModelLoad, TwentyThousandTensorsLoadInLinearTime) {
  constexpr int64_t kLayers = 2300;
  kiln_test::TempDir tmp;
  const auto t0 = Clock::now();
  save_tiny(kLayers, tmp.file("hf"), tmp.file("model.gguf"));
  std::printf("[ timing ] build, init and save %lld layers (HF and GGUF): %.2f s\n",
              static_cast<long long>(kLayers), seconds_since(t0));
  const std::string last = "model.layers." + std::to_string(kLayers - 1) + ".mlp.down_proj.weight";
  std::vector<float> want;
  using WD = models::ModelOptions::WeightDType;
  // bf16 (every matrix retyped) once, from the HF directory: the test stays a few seconds.
  for (const std::string& path : {tmp.file("hf"), tmp.file("model.gguf")})
    for (WD wd : {WD::f32, WD::bf16}) {
      if (wd == WD::bf16 && path == tmp.file("model.gguf")) continue;
      Context ctx;
      CpuBackend cpu(1);
      const auto t1 = Clock::now();
      auto model = models::load(ctx, cpu, path, {.max_seq_len = 4, .weight_dtype = wd});
      const double s = seconds_since(t1);
      const auto params = model->named_parameters();
      EXPECT_EQ(params.size(), size_t(kLayers * 9 + 2));
      const Tensor w = model->parameter(last);
      if (wd == WD::f32) {
        if (want.empty()) want = w.get<float>();
        EXPECT_EQ(w.get<float>(), want) << path;  // the HF file and the GGUF file agree
      } else {
        EXPECT_EQ(w.dtype(), bf16);
      }
      std::printf("[ timing ] load %zu tensors from %s (%s): %.2f s\n", params.size(),
                  path == tmp.file("hf") ? "a Hugging Face directory" : "a GGUF file",
                  wd == WD::f32 ? "f32" : "bf16", s);
    }
}

// num_hidden_layers 100000 over files of 2 layers: the error names the first
// missing layer and comes before any module is built (the Context holds no new
// node), not after building 100000 layers.
TEST(ModelLoad, MoreLayersThanTheFilesHoldFailsBeforeBuilding) {
  kiln_test::TempDir tmp;
  save_tiny(2, tmp.file("hf"), tmp.file("good.gguf"));
  const std::string config = tmp.file("hf") + "/config.json";
  std::string text = read_text(config);
  const std::string field = "\"num_hidden_layers\": 2";
  ASSERT_NE(text.find(field), std::string::npos) << text;
  text.replace(text.find(field), field.size(), "\"num_hidden_layers\": 100000");
  std::ofstream(config) << text;
  {
    Context ctx;
    CpuBackend cpu(1);
    const auto t0 = Clock::now();
    const std::string msg =
        kiln_test::error_message([&] { models::load(ctx, cpu, tmp.file("hf")); });
    std::printf("[ timing ] num_hidden_layers 100000, 2 layers in the files: refused in %.3f s\n",
                seconds_since(t0));
    EXPECT_TRUE(kiln_test::is_error(msg, "models",
                                    {"model.safetensors", "no tensor of layer 2",
                                     "'model.layers.2.*'", "num_hidden_layers", "100000"}));
    EXPECT_EQ(ctx.size(), size_t(0)) << "modules were built before the check";
  }
  // The same for GGUF's block_count.
  GgufFile good(tmp.file("good.gguf"));
  GgufWriter w;
  for (auto [key, v] : good.metadata())
    w.set(key, key == "llama.block_count" ? GgufValue(uint32_t(100000)) : v);
  for (const GgufTensorInfo& t : good.tensors())
    w.add_tensor_data(t.name, t.dtype, t.shape, good.read_bytes(t.name));
  w.save(tmp.file("model.gguf"));
  Context ctx;
  CpuBackend cpu(1);
  EXPECT_KILN_ERROR(models::load(ctx, cpu, tmp.file("model.gguf")), "models", "model.gguf",
                    "no tensor of layer 2", "'blk.2.*'", "llama.block_count", "100000");
  EXPECT_EQ(ctx.size(), size_t(0));
}

}  // namespace
}  // namespace kiln::test
