// LoRA adapter files and adapter management on the fixture models: kiln's
// files in PEFT's layout (read back by kiln and by a PEFT-layout reader in
// Python), several adapters switched over one base, merge / unmerge and the
// merged model exported as a Hugging Face directory and as GGUF, and errors.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <set>

#include "../common/error_check.h"
#include "../common/temp_dir.h"
#include "kiln/lora.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

void write_lora_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Copies an adapter fixture into `dir`, config text replaced by `config`.
void copy_adapter(const std::string& fixture, const std::string& dir, const std::string& config) {
  fs::create_directories(dir);
  fs::copy_file(fixture_dir(fixture) + "/adapter_model.safetensors",
                dir + "/adapter_model.safetensors");
  write_lora_text(dir + "/adapter_config.json", config);
}

std::vector<float> random_values(size_t n, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng));
  return v;
}

bool have_torch() { return std::system("/usr/bin/python3 -c 'import torch' >/dev/null 2>&1") == 0; }

struct SaveCase {
  const char* base;
  nn::LoraConfig cfg;
};

class LoraSave : public ::testing::TestWithParam<SaveCase> {};

// An adapter made and changed by kiln, saved: kiln reads it back to the same
// logits, its names, shapes and config are PEFT's, and a PEFT-layout reader
// (read_peft_adapter.py, where torch is installed) computes the same logits.
TEST_P(LoraSave, FilesArePeftsLayout) {
  const SaveCase& c = GetParam();
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(c.base));
  const std::vector<std::string> paths = nn::add_lora(*model, cpu, c.cfg, "default", 5);
  // At init B = 0: the adapter changes nothing yet. Give B values, as training would.
  uint64_t seed = 1;
  for (const auto& [p, l] : nn::lora_layers(*model, "default")) {
    Tensor b = l->find_lora("default")->B->weight();
    std::vector<float> v = random_values(size_t(b.numel()), seed++, 0.3);
    b.set(v);
  }
  Expected e(c.base);
  const std::vector<float> logits = run_logits(ctx, *model, e);
  models::save_lora(*model, tmp.file("adapter"), "default", "kiln-tests/base");

  // kiln reads it back into a fresh base.
  Context ctx2;
  auto fresh = models::load_pretrained(ctx2, cpu, fixture_dir(c.base));
  const models::LoraFileConfig back = models::load_lora(*fresh, cpu, tmp.file("adapter"));
  EXPECT_EQ(run_logits(ctx2, *fresh, e), logits);
  EXPECT_EQ(back.lora.r, c.cfg.r);
  EXPECT_EQ(back.lora.alpha, c.cfg.alpha);
  EXPECT_EQ(back.lora.use_rslora, c.cfg.use_rslora);
  EXPECT_EQ(back.lora.target_modules, c.cfg.target_modules);
  EXPECT_EQ(back.base_model_name_or_path, "kiln-tests/base");

  // Names and shapes as PEFT writes them.
  const bool gpt2 = std::string(c.base) == "gpt2";
  SafetensorsFile f(tmp.file("adapter") + "/adapter_model.safetensors");
  EXPECT_EQ(f.tensors().size(), 2 * paths.size());
  for (const auto& [p, l] : nn::lora_layers(*model, "default")) {
    const std::string n = "base_model.model." + std::string(gpt2 ? "transformer." : "") + p;
    const TensorInfo* a = f.find(n + ".lora_A.weight");
    const TensorInfo* b = f.find(n + ".lora_B.weight");
    ASSERT_TRUE(a && b) << n;
    EXPECT_EQ(a->dims, (std::vector<int64_t>{c.cfg.r, l->in_features()}));
    EXPECT_EQ(b->dims, (std::vector<int64_t>{l->out_features(), c.cfg.r}));
    EXPECT_EQ(a->file_dtype, "F32");
  }
  const std::string config = slurp(tmp.file("adapter") + "/adapter_config.json");
  for (const char* key : {"\"peft_type\": \"LORA\"", "\"r\":", "\"lora_alpha\":",
                          "\"target_modules\":", "\"lora_dropout\":", "\"bias\": \"none\"",
                          "\"use_rslora\":", "\"base_model_name_or_path\":", "\"task_type\":"})
    EXPECT_NE(config.find(key), std::string::npos) << key << " in " << config;
  EXPECT_NE(config.find(gpt2 ? "\"fan_in_fan_out\": true" : "\"fan_in_fan_out\": false"),
            std::string::npos);

  if (!have_torch()) GTEST_SKIP() << "no python3-torch: the PEFT-layout reader did not run";
  {
    Context c3;
    const std::vector<int64_t> d = e.dims("input_ids");
    Tensor ids = c3.tensor(i32, {d[0], d[1]});
    Tensor lg = c3.tensor(f32, {d[0], d[1], model->vocab_size()});
    auto buf = allocate_tensors(c3, cpu);
    ids.set(e.ints("input_ids"));
    lg.set(logits);
    std::vector<NamedTensor> out = {{"input_ids", ids}, {"logits", lg}};
    save_safetensors(tmp.file("logits.safetensors"), out);
  }
  const std::string cmd = "/usr/bin/python3 " + std::string(KILN_SOURCE_DIR) +
                          "/tests/models/read_peft_adapter.py " + tmp.file("adapter") + " " +
                          c.base + " " + tmp.file("logits.safetensors");
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

nn::LoraConfig llama_cfg() {
  nn::LoraConfig c;
  c.r = 3;
  c.alpha = 6;
  c.use_rslora = true;
  c.target_modules = {"q_proj", "v_proj", "o_proj", "down_proj"};
  return c;
}
nn::LoraConfig gpt2_cfg() {
  nn::LoraConfig c;
  c.r = 2;
  c.alpha = 5.5f;
  c.target_modules = {"c_attn", "c_fc"};
  return c;
}

INSTANTIATE_TEST_SUITE_P(Bases, LoraSave,
                         ::testing::Values(SaveCase{"llama3_gqa", llama_cfg()},
                                           SaveCase{"gpt2", gpt2_cfg()}),
                         [](const auto& info) { return std::string(info.param.base); });

// Two adapters over one base, switched without reloading anything.
TEST(LoraAdapters, SwitchedWithoutReloadingTheBase) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  models::load_lora(*model, cpu, fixture_dir("lora_llama3_gqa"));
  models::load_lora(*model, cpu, fixture_dir("lora_llama3_gqa_rslora"), "other");
  EXPECT_EQ(nn::lora_adapters(*model), (std::vector<std::string>{"default", "other"}));
  EXPECT_EQ(nn::active_lora_adapter(*model), "other");  // the last loaded, as PEFT's get_peft_model
  Expected e1("lora_llama3_gqa"), e2("lora_llama3_gqa_rslora");
  EXPECT_LT(rel_error(run_logits(ctx, *model, e2), e2.floats("logits")), 1e-4);
  nn::set_lora_adapter(*model, "default");
  EXPECT_LT(rel_error(run_logits(ctx, *model, e1), e1.floats("logits")), 1e-4);
  // Only the active adapter trains: 2 tensors per adapted layer.
  EXPECT_EQ(model->trainable_parameters().size(), 2 * nn::lora_layers(*model, "default").size());
  nn::set_lora_adapter(*model, "other");
  EXPECT_EQ(model->trainable_parameters().size(), 2 * nn::lora_layers(*model, "other").size());
  EXPECT_LT(rel_error(run_logits(ctx, *model, e2), e2.floats("logits")), 1e-4);
  EXPECT_KILN_ERROR(nn::set_lora_adapter(*model, "nope"), "lora", "no adapter 'nope'");
  // The base's own files hold no adapter tensors.
  EXPECT_EQ(model->named_base_parameters().size() + 2 * (28 / 2 + 12 / 2),
            model->named_parameters().size());
}

struct MergeCase {
  const char* adapter;
  const char* base;
};

class LoraMerge : public ::testing::TestWithParam<MergeCase> {};

// merge_lora folds the adapter into the weights (W += scaling B A, transposed
// for GPT-2's Conv1D): the same logits, exported as a plain Hugging Face
// directory and as GGUF; unmerge_lora gives the base weights back.
TEST_P(LoraMerge, MergedModelExportsAsHuggingFaceAndGguf) {
  const MergeCase& c = GetParam();
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(c.base));
  std::vector<std::vector<float>> before;
  for (const auto& [n, p] : model->named_base_parameters()) before.push_back(p.get<float>());
  models::load_lora(*model, cpu, fixture_dir(c.adapter));
  Expected e(c.adapter);
  nn::merge_lora(*model);
  EXPECT_LT(rel_error(run_logits(ctx, *model, e), e.floats("logits")), 1e-4);
  models::save_pretrained(*model, tmp.file("merged"));
  models::save_gguf(*model, tmp.file("merged.gguf"));
  {
    Context c2;
    auto m = models::load_pretrained(c2, cpu, tmp.file("merged"));
    EXPECT_LT(rel_error(run_logits(c2, *m, e), e.floats("logits")), 1e-4);
    EXPECT_TRUE(nn::lora_adapters(*m).empty());
  }
  {
    Context c3;
    auto m = models::load_gguf(c3, cpu, tmp.file("merged.gguf"));
    EXPECT_LT(rel_error(run_logits(c3, *m, e), e.floats("logits")), 1e-4);
  }
  EXPECT_KILN_ERROR(nn::set_lora_adapter(*model, ""), "lora", "merged", "unmerge_lora");
  EXPECT_KILN_ERROR(nn::merge_lora(*model), "lora", "already merged");
  nn::unmerge_lora(*model);
  size_t i = 0;
  for (const auto& [n, p] : model->named_base_parameters())
    EXPECT_LT(rel_error(p.get<float>(), before[i++]), 1e-6) << n;
  EXPECT_LT(rel_error(run_logits(ctx, *model, e), e.floats("logits")), 1e-4);
  EXPECT_KILN_ERROR(nn::unmerge_lora(*model), "lora", "no adapter is merged");
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LoraMerge,
                         ::testing::Values(MergeCase{"lora_llama3_gqa", "llama3_gqa"},
                                           MergeCase{"lora_gpt2", "gpt2"}),
                         [](const auto& info) { return std::string(info.param.adapter); });

// A bad adapter directory is refused before anything is added to the model.
TEST(LoraErrors, BadFilesAreRefusedAndChangeNothing) {
  const std::string good = slurp(fixture_dir("lora_llama3_gqa") + "/adapter_config.json");
  auto edited = [&](const std::string& from, const std::string& to) {
    std::string t = good;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) t.replace(at, from.size(), to);
    return t;
  };
  const std::string targets =
      "\"target_modules\": [\n    \"q_proj\",\n    \"k_proj\",\n    \"v_proj\",\n    "
      "\"o_proj\",\n    \"gate_proj\",\n    \"up_proj\",\n    \"down_proj\"\n  ]";
  struct Case {
    std::string config;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {edited("\"bias\": \"none\"", "\"bias\": \"none\", \"future_option\": 1"),
       {"adapter_config.json", "field 'future_option'", "not supported"}},
      {edited("\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]"),
       {"field 'modules_to_save'", "default"}},
      {edited("\"use_dora\": false", "\"use_dora\": true"), {"field 'use_dora'"}},
      {edited("\"bias\": \"none\"", "\"bias\": \"all\""), {"field 'bias'", "'all'"}},
      {edited("\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\""), {"field 'peft_type'", "IA3"}},
      {edited(targets, "\"target_modules\": [\"nothing_here\"]"),
       {"target_modules", "matches no Linear layer"}},
      {edited(targets, "\"target_modules\": [\"q_proj\"]"),
       {"adapter_model.safetensors", "model.layers.0.self_attn.k_proj.lora_A.weight",
        "not a LoRA weight"}},
      {edited(targets, "\"target_modules\": [\"q_proj\", \"lm_head\"]"),
       {"'base_model.model.lm_head.lora_A.weight' is missing"}},
      {edited("\"r\": 4", "\"r\": 5"), {"lora_A.weight' is [4, 32]", "r = 5", "[5, 32]"}},
      {"[1, 2]", {"adapter_config.json", "JSON object"}},
  };
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  const size_t n_params = model->named_parameters().size();
  int k = 0;
  for (const Case& c : cases) {
    const std::string dir = tmp.file("a" + std::to_string(k++));
    copy_adapter("lora_llama3_gqa", dir, c.config);
    const std::string msg = kiln_test::error_message([&] { models::load_lora(*model, cpu, dir); });
    for (const std::string& part : c.parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    EXPECT_EQ(msg.rfind("[models] ", 0), 0u) << msg;
    EXPECT_TRUE(nn::lora_adapters(*model).empty()) << msg;
    EXPECT_EQ(model->named_parameters().size(), n_params);
  }
  EXPECT_KILN_ERROR(models::load_lora(*model, cpu, tmp.file("none")), "models", "no such adapter");
  fs::create_directories(tmp.file("empty"));
  EXPECT_KILN_ERROR(models::load_lora(*model, cpu, tmp.file("empty")), "models",
                    "adapter_config.json is missing");
  // The model-level API.
  nn::LoraConfig bad;
  bad.target_modules = {"self_attn"};
  EXPECT_KILN_ERROR(nn::add_lora(*model, cpu, bad), "lora", "'model.layers.0.self_attn'",
                    "LoRA adapts Linear layers");
  bad.target_modules = {"q_proj"};
  bad.r = 0;
  EXPECT_KILN_ERROR(nn::add_lora(*model, cpu, bad), "lora", "r must be >= 1");
  bad.r = 2;
  nn::add_lora(*model, cpu, bad);
  EXPECT_KILN_ERROR(nn::add_lora(*model, cpu, bad), "lora", "already has an adapter 'default'");
  EXPECT_KILN_ERROR(models::save_lora(*model, tmp.file("x"), "other"), "models", "no adapter");
}

}  // namespace
}  // namespace kiln::test
