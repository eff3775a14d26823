// Memory-mapped weights: params that point into a private map of the file give
// the logits copied params give, training never writes the file, and a file
// shorter than its header says is a kiln::Error, not a SIGBUS.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "models/mapped_file.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The file /proc/self/maps names for the mapping that holds address p ("" when
// p is in anonymous memory: the heap, a copy).
std::string mapped_path(const void* p) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  while (std::getline(maps, line)) {
    unsigned long lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2 || a < lo || a >= hi) continue;
    const size_t slash = line.find('/');
    return slash == std::string::npos ? "" : line.substr(slash);
  }
  return "";
}

models::ModelOptions with_mmap(bool on) {
  models::ModelOptions o;
  o.mmap = on;
  return o;
}

// Copies a fixture's directory (so that a test can change or watch its files).
void copy_fixture(const std::string& fixture, const kiln_test::TempDir& to) {
  for (const auto& e : fs::directory_iterator(fixture_dir(fixture)))
    fs::copy_file(e.path(), to.path() / e.path().filename());
}

class ModelMmap : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelMmap, MappedParamsGiveTheCopiedLogits) {
  const std::string dir = fixture_dir(GetParam());
  Expected e(GetParam());
  Context ctx;
  CpuBackend cpu(1);
  auto mapped = models::load_pretrained(ctx, cpu, dir, with_mmap(true));
  auto copied = models::load_pretrained(ctx, cpu, dir, with_mmap(false));
  const std::vector<float> a = run_logits(ctx, *mapped, e), b = run_logits(ctx, *copied, e);
  EXPECT_EQ(a, b);  // the same bytes, the same kernels
  EXPECT_LT(rel_error(a, e.floats("logits")), 1e-4);
  // f32 files: every param is used in place, in a map of the safetensors file.
  EXPECT_GT(mapped->load_stats.bytes_read, 0);
  EXPECT_EQ(mapped->load_stats.bytes_mapped, mapped->load_stats.bytes_read);
  EXPECT_EQ(copied->load_stats.bytes_mapped, 0);
  for (const auto& [name, p] : mapped->named_parameters()) {
    EXPECT_NE(mapped_path(p.node()->data).find(".safetensors"), std::string::npos) << name;
    EXPECT_EQ(mapped_path(copied->parameter(name).node()->data), "") << name;
  }
}

INSTANTIATE_TEST_SUITE_P(F32Fixtures, ModelMmap,
                         ::testing::Values("llama3_gqa", "qwen2_bias", "mistral_swa", "gpt2"));

// F16/BF16 files converted to f32 (the default) cannot be used in place.
TEST(ModelMmapDtypes, ConvertedTensorsAreCopies) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama_tied_bf16"));
  EXPECT_EQ(model->load_stats.bytes_mapped, 0);
  Expected e("llama_tied_bf16");
  EXPECT_LT(rel_error(run_logits(ctx, *model, e), e.floats("logits")), 1e-4);
}

// GGUF: tensors stored as kiln uses them are mapped; the q/k rows llama.cpp
// reorders are converted copies. Both ways give the same logits.
TEST(ModelMmapGguf, MapsWhatNeedsNoConversion) {
  kiln_test::TempDir tmp;
  for (const char* fixture : {"llama3_gqa", "qwen2_bias"}) {
    const std::string path = tmp.file(std::string(fixture) + ".gguf");
    {
      Context ctx;
      CpuBackend cpu(1);
      models::save_gguf(*models::load_pretrained(ctx, cpu, fixture_dir(fixture)), path);
    }
    Expected e(fixture);
    Context ctx;
    CpuBackend cpu(1);
    auto mapped = models::load_gguf(ctx, cpu, path, with_mmap(true));
    auto copied = models::load_gguf(ctx, cpu, path, with_mmap(false));
    EXPECT_EQ(run_logits(ctx, *mapped, e), run_logits(ctx, *copied, e)) << fixture;
    EXPECT_EQ(copied->load_stats.bytes_mapped, 0);
    const bool reordered = std::string(fixture) == "llama3_gqa";  // llama.cpp's q/k rows
    for (const auto& [name, p] : mapped->named_parameters()) {
      const bool qk =
          name.find("q_proj") != std::string::npos || name.find("k_proj") != std::string::npos;
      const bool in_file = mapped_path(p.node()->data).find(".gguf") != std::string::npos;
      EXPECT_EQ(in_file, !(reordered && qk)) << fixture << " " << name;
    }
    if (reordered) {
      EXPECT_GT(mapped->load_stats.bytes_mapped, 0);
      EXPECT_LT(mapped->load_stats.bytes_mapped, mapped->load_stats.bytes_read);
    } else {
      EXPECT_EQ(mapped->load_stats.bytes_mapped, mapped->load_stats.bytes_read);
    }
  }
}

// Optimizer steps write the mapped params (copy-on-write pages of the process),
// never the file: its bytes, and a model loaded from it afterwards, are as before.
TEST(ModelMmapTraining, StepsNeverWriteTheFile) {
  kiln_test::TempDir tmp;
  copy_fixture("gpt2", tmp);
  const std::string file = tmp.file("model.safetensors");
  const std::string before = file_bytes(file);
  Expected e("gpt2");
  const std::vector<int64_t> d = e.dims("input_ids");
  std::map<std::string, std::vector<float>> start, trained;
  {
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::load_pretrained(ctx, cpu, tmp.str());
    ASSERT_EQ(model->load_stats.bytes_mapped, model->load_stats.bytes_read);
    for (const auto& [n, p] : model->named_parameters()) start[n] = p.get<float>();
    const int64_t B = d[0], T = d[1], V = model->vocab_size();
    model->train();
    Tensor ids = ctx.input(i32, {B, T}, "input_ids");
    Tensor labels = ctx.input(i32, {B * T}, "labels");
    Tensor logits = (*model)(ids);
    OptConfig cfg;
    cfg.inputs = ids;
    cfg.outputs = logits;
    cfg.loss = LossKind::user;
    cfg.user_loss = cross_entropy(logits.reshape({B * T, V}), labels);
    cfg.model = model.get();
    cfg.backends = {&cpu};
    cfg.schedule = schedule::constant(OptimizerParams{}.set_lr(1e-2f));
    OptContext opt(cfg);
    for (int step = 0; step < 2; ++step) {
      opt.inputs().set(e.ints("input_ids"));
      labels.set(e.ints("labels"));
      opt.train_batch();
    }
    for (const auto& [n, p] : model->named_parameters()) trained[n] = p.get<float>();
  }
  int changed = 0;
  for (const auto& [n, v] : start) changed += v != trained[n];
  EXPECT_EQ(changed, int(start.size())) << "every param trains";
  EXPECT_TRUE(file_bytes(file) == before) << "the mapped file changed";
  Context ctx;
  CpuBackend cpu(1);
  auto again = models::load_pretrained(ctx, cpu, tmp.str());
  for (const auto& [n, p] : again->named_parameters()) EXPECT_EQ(p.get<float>(), start[n]) << n;
}

// A truncated file is refused before it is mapped: a kiln::Error naming it.
TEST(ModelMmapErrors, TruncatedFileIsAnErrorNotSigbus) {
  kiln_test::TempDir tmp;
  copy_fixture("gpt2", tmp);
  const std::string file = tmp.file("model.safetensors");
  const uintmax_t size = fs::file_size(file);
  EXPECT_TRUE(kiln_test::is_error(
      kiln_test::error_message([&] { models::detail::MappedFile m(file, size + 4); }), "models",
      {file.c_str(), "shorter than", std::to_string(size + 4).c_str()}));
  fs::resize_file(file, size - 8);
  Context ctx;
  CpuBackend cpu(1);
  EXPECT_TRUE(kiln_test::is_error(
      kiln_test::error_message([&] { models::load_pretrained(ctx, cpu, tmp.str()); }),
      "safetensors", {file.c_str()}));
  const std::string gguf = tmp.file("m.gguf");
  {
    Context c2;
    models::save_gguf(*models::load_pretrained(c2, cpu, fixture_dir("gpt2")), gguf);
  }
  fs::resize_file(gguf, fs::file_size(gguf) - 8);
  EXPECT_TRUE(
      kiln_test::is_error(kiln_test::error_message([&] { models::load_gguf(ctx, cpu, gguf); }),
                          "gguf", {gguf.c_str()}));
}

}  // namespace
}  // namespace kiln::test
