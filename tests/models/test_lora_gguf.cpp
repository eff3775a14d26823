// LoRA adapters as GGUF files in llama.cpp's format (kiln/lora.h,
// src/models/lora_gguf.cpp): kiln reads back what it writes; the file holds
// what llama.cpp computes with (its base file's weight + (alpha / r) B A, with
// the file's names and row order, equals the GGUF of the merged model);
// conversions PEFT <-> GGUF keep every value; bad files name what is wrong.
// The proof that llama.cpp itself agrees is scripts/llamacpp-lora-check.mjs.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <random>

#include "../common/error_check.h"
#include "../common/temp_dir.h"
#include "kiln/lora.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::vector<float> normal_values(size_t n, uint64_t seed, double sd) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng));
  return v;
}

std::vector<float> f32_values(const GgufFile& f, const std::string& name) {
  return gguf_dequantize(f.tensor_info(name), f.read_bytes(name));
}

// Gives B (zero at init) values, as training would.
void train_b(models::CausalLM& model) {
  uint64_t seed = 11;
  for (const auto& [p, l] : nn::lora_layers(model, "default")) {
    Tensor b = l->find_lora("default")->B->weight();
    b.set(normal_values(size_t(b.numel()), seed++, 0.3));
  }
}

struct GgufCase {
  const char* base;
  nn::LoraConfig cfg;
  const char* arch;
};

class LoraGguf : public ::testing::TestWithParam<GgufCase> {};

// Written, read back to the same logits; and the file is what llama.cpp
// computes with: for every pair, the base file's weight plus
// (adapter.lora.alpha / r) lora_b lora_a equals the merged model's GGUF weight,
// names, shapes and the q/k row order included.
TEST_P(LoraGguf, RoundTripAndLlamaCppArithmetic) {
  const GgufCase& c = GetParam();
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(c.base));
  models::save_gguf(*model, tmp.file("base.gguf"));
  nn::add_lora(*model, cpu, c.cfg, "default", 3);
  train_b(*model);
  Expected e(c.base);
  const std::vector<float> logits = run_logits(ctx, *model, e);
  models::save_lora_gguf(*model, tmp.file("adapter.gguf"));

  {  // kiln reads it back, onto the Hugging Face base and onto the GGUF base
    Context c2;
    auto fresh = models::load_pretrained(c2, cpu, fixture_dir(c.base));
    const models::LoraFileConfig back = models::load_lora(*fresh, cpu, tmp.file("adapter.gguf"));
    EXPECT_LT(rel_error(run_logits(c2, *fresh, e), logits), 1e-6);
    EXPECT_EQ(back.lora.r, c.cfg.r);
    EXPECT_FALSE(back.lora.use_rslora);  // folded into alpha
    EXPECT_NEAR(back.lora.scaling(), c.cfg.scaling(), 1e-6 * c.cfg.scaling());
    EXPECT_EQ(back.lora.target_modules, c.cfg.target_modules);
    Context c3;
    auto from_gguf = models::load_gguf(c3, cpu, tmp.file("base.gguf"));
    models::load_lora(*from_gguf, cpu, tmp.file("adapter.gguf"));
    EXPECT_LT(rel_error(run_logits(c3, *from_gguf, e), logits), 1e-5);
  }

  const GgufFile f(tmp.file("adapter.gguf"));
  EXPECT_EQ(f.get("general.type").as_string(), "adapter");
  EXPECT_EQ(f.get("general.architecture").as_string(), c.arch);
  EXPECT_EQ(f.get("adapter.type").as_string(), "lora");
  EXPECT_EQ(f.get("adapter.lora.alpha").type(), GgufType::f32);  // llama.cpp reads an f32
  const double scale = f.get("adapter.lora.alpha").as_float() / double(c.cfg.r);
  EXPECT_NEAR(scale, c.cfg.scaling(), 1e-6 * c.cfg.scaling());

  nn::merge_lora(*model);
  models::save_gguf(*model, tmp.file("merged.gguf"));
  const GgufFile base(tmp.file("base.gguf")), merged(tmp.file("merged.gguf"));
  const size_t n_layers = nn::lora_layers(*model, "default").size();
  ASSERT_EQ(f.tensors().size(), 2 * n_layers);
  size_t checked = 0;
  for (const GgufTensorInfo& ta : f.tensors()) {
    if (ta.name.size() < 7 || ta.name.substr(ta.name.size() - 7) != ".lora_a") continue;
    const std::string w = ta.name.substr(0, ta.name.size() - 7);
    const GgufTensorInfo& tb = f.tensor_info(w + ".lora_b");
    const GgufTensorInfo& tw = base.tensor_info(w);  // the weight llama.cpp adapts
    EXPECT_EQ(ta.dtype, f32);
    // ggml's checks: W ne {in, out}, A ne {in, r}, B ne {r, out} (kiln order reversed).
    ASSERT_EQ(ta.shape, Shape({c.cfg.r, tw.shape[1]})) << ta.name;
    ASSERT_EQ(tb.shape, Shape({tw.shape[0], c.cfg.r})) << tb.name;
    const std::vector<float> a = f32_values(f, ta.name), b = f32_values(f, tb.name);
    std::vector<float> want = f32_values(base, w);
    const int64_t out = tw.shape[0], in = tw.shape[1], r = c.cfg.r;
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) {
        double d = 0;
        for (int64_t k = 0; k < r; ++k) d += double(b[size_t(o * r + k)]) * a[size_t(k * in + i)];
        want[size_t(o * in + i)] += float(scale * d);
      }
    EXPECT_LT(rel_error(f32_values(merged, w), want), 1e-5) << w;
    ++checked;
  }
  EXPECT_EQ(checked, n_layers);
}

nn::LoraConfig gguf_llama_lora() {  // GQA: q and k rows of 4 and 2 heads reordered
  nn::LoraConfig c;
  c.r = 3;
  c.alpha = 6;
  c.use_rslora = true;
  c.target_modules = {"q_proj", "k_proj", "v_proj", "o_proj", "down_proj", "lm_head"};
  return c;
}
nn::LoraConfig gguf_gpt2_lora() {  // Conv1D layers: GGUF stores their weights transposed
  nn::LoraConfig c;
  c.r = 2;
  c.alpha = 5.5f;
  c.target_modules = {"c_attn", "c_proj", "c_fc"};  // tree order: read back so
  return c;
}
nn::LoraConfig gguf_qwen3_lora() {  // llama.cpp keeps Qwen's q/k rows as HF has them
  nn::LoraConfig c;
  c.r = 2;
  c.alpha = 4;
  c.target_modules = {"q_proj", "k_proj"};
  return c;
}

INSTANTIATE_TEST_SUITE_P(Bases, LoraGguf,
                         ::testing::Values(GgufCase{"llama3_gqa", gguf_llama_lora(), "llama"},
                                           GgufCase{"gpt2", gguf_gpt2_lora(), "gpt2"},
                                           GgufCase{"qwen3_qknorm_f16", gguf_qwen3_lora(),
                                                    "qwen3"}),
                         [](const auto& info) { return std::string(info.param.base); });

// PEFT -> GGUF -> PEFT keeps every value (the base named by its Hugging Face
// directory or its GGUF file: only the config is read), and the GGUF adapter
// gives the logits PEFT's reference computed for the PEFT one.
TEST(LoraGgufConvert, PeftToGgufAndBack) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto base = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  models::save_gguf(*base, tmp.file("base.gguf"));
  models::convert_lora(fixture_dir("lora_llama3_gqa"), tmp.file("a.gguf"),
                       fixture_dir("llama3_gqa"));
  models::convert_lora(tmp.file("a.gguf"), tmp.file("peft"), tmp.file("base.gguf"));
  models::convert_lora(tmp.file("peft"), tmp.file("b.gguf"), tmp.file("base.gguf"));
  const SafetensorsFile orig(fixture_dir("lora_llama3_gqa") + "/adapter_model.safetensors");
  const SafetensorsFile back(tmp.file("peft") + "/adapter_model.safetensors");
  ASSERT_EQ(back.tensors().size(), orig.tensors().size());
  for (const TensorInfo& t : orig.tensors()) {
    ASSERT_TRUE(back.find(t.name)) << t.name;
    EXPECT_EQ(back.read_bytes(t.name), orig.read_bytes(t.name)) << t.name;  // both F32
  }
  const std::string cfg = [&] {
    std::ifstream in(tmp.file("peft") + "/adapter_config.json");
    return std::string((std::istreambuf_iterator<char>(in)), {});
  }();
  const models::LoraFileConfig pc = models::parse_lora_config(cfg, "adapter_config.json");
  EXPECT_EQ(pc.lora.r, 4);
  EXPECT_EQ(pc.lora.alpha, 8);
  EXPECT_EQ(pc.lora.target_modules,
            (std::vector<std::string>{"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                      "up_proj", "down_proj"}));
  EXPECT_EQ(pc.base_model_name_or_path, tmp.file("base.gguf"));  // GGUF adapters name no base
  {
    const GgufFile a(tmp.file("a.gguf")), b(tmp.file("b.gguf"));
    ASSERT_EQ(a.tensors().size(), b.tensors().size());
    for (const GgufTensorInfo& t : a.tensors())
      EXPECT_EQ(a.read_bytes(t.name), b.read_bytes(t.name));
  }
  models::load_lora(*base, cpu, tmp.file("a.gguf"));
  Expected e("lora_llama3_gqa");
  EXPECT_LT(rel_error(run_logits(ctx, *base, e), e.floats("logits")), 1e-4);
}

// Only some layers adapted: target_modules names exactly those (PEFT would
// otherwise adapt every layer of a leaf name).
TEST(LoraGgufConvert, PartialAdapterKeepsItsLayers) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  nn::LoraConfig c;
  c.r = 2;
  c.target_modules = {"model.layers.1.self_attn.q_proj"};
  nn::add_lora(*model, cpu, c);
  train_b(*model);
  models::save_lora_gguf(*model, tmp.file("a.gguf"));
  models::convert_lora(tmp.file("a.gguf"), tmp.file("peft"), fixture_dir("llama3_gqa"));
  Context c2;
  auto fresh = models::load_pretrained(c2, cpu, fixture_dir("llama3_gqa"));
  const models::LoraFileConfig back = models::load_lora(*fresh, cpu, tmp.file("peft"));
  EXPECT_EQ(back.lora.target_modules,
            (std::vector<std::string>{"model.layers.1.self_attn.q_proj"}));
  EXPECT_EQ(nn::lora_layers(*fresh, "default").size(), 1u);
}

// A GGUF adapter that does not fit the base is refused, naming the tensor or
// key, before anything is added to the model.
TEST(LoraGgufErrors, MismatchesNameTheTensor) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  const std::string good = tmp.file("good.gguf");
  models::convert_lora(fixture_dir("lora_llama3_gqa"), good, fixture_dir("llama3_gqa"));
  const GgufFile g(good);

  // A copy of the good file: metadata edited by `meta`, each tensor renamed or
  // dropped ("") and reshaped by `tensor`.
  using MetaEdit = std::function<void(GgufWriter&)>;
  using TensorEdit = std::function<std::pair<std::string, Shape>(const GgufTensorInfo&)>;
  int k = 0;
  auto edited = [&](const MetaEdit& meta, const TensorEdit& tensor) {
    GgufWriter w;
    for (const auto& [key, v] : g.metadata()) w.set(key, v);
    meta(w);
    for (const GgufTensorInfo& t : g.tensors()) {
      const auto [name, shape] = tensor(t);
      if (name.empty()) continue;
      std::vector<uint8_t> bytes = g.read_bytes(t.name);
      bytes.resize(size_t(shape.numel()) * 4);
      w.add_tensor_data(name, f32, shape, bytes);
    }
    const std::string path = tmp.file("bad" + std::to_string(k++) + ".gguf");
    w.save(path);
    return path;
  };
  const MetaEdit same_meta = [](GgufWriter&) {};
  const TensorEdit same = [](const GgufTensorInfo& t) { return std::pair{t.name, t.shape}; };
  auto rename = [](const std::string& from, const std::string& to) -> TensorEdit {
    return [=](const GgufTensorInfo& t) {
      return std::pair{t.name == from ? to : t.name, t.shape};
    };
  };
  struct Case {
    std::string path;
    std::vector<std::string> parts;
  };
  const Case cases[] = {
      {edited(same_meta, rename("blk.1.attn_q.weight.lora_a", "blk.7.attn_q.weight.lora_a")),
       {"tensor 'blk.7.attn_q.weight.lora_a'", "adapts 'blk.7.attn_q.weight'",
        "not a weight of a Linear layer"}},
      {edited(same_meta, rename("blk.0.ffn_up.weight.lora_b", "blk.0.ffn_up.weight.extra")),
       {"tensor 'blk.0.ffn_up.weight.extra'", "not a LoRA tensor"}},
      {edited(same_meta, rename("blk.0.attn_v.weight.lora_b", "")),
       {"tensor 'blk.0.attn_v.weight.lora_b' is missing", "blk.0.attn_v.weight.lora_a"}},
      {edited(same_meta,
              [](const GgufTensorInfo& t) {
                return std::pair{t.name, t.name == "blk.1.attn_k.weight.lora_b"
                                             ? Shape({t.shape[0] / 2, t.shape[1]})
                                             : t.shape};
              }),
       {"tensor 'blk.1.attn_k.weight.lora_b' is [8, 4]", "[16, 4]"}},
      {edited(same_meta,
              [](const GgufTensorInfo& t) {
                return std::pair{t.name, t.name == "blk.0.ffn_gate.weight.lora_a"
                                             ? Shape({t.shape[0] / 2, t.shape[1]})
                                             : t.shape};
              }),
       {"tensor 'blk.0.ffn_gate.weight.lora_a' is [2, 32]", "[4, 32]"}},
      {edited([](GgufWriter& w) { w.set("general.type", std::string("model")); }, same),
       {"metadata 'general.type' is 'model'"}},
      {edited([](GgufWriter& w) { w.set("general.architecture", std::string("qwen2")); }, same),
       {"metadata 'general.architecture' is 'qwen2'", "base model is 'llama'"}},
      {edited([](GgufWriter& w) { w.set("adapter.type", std::string("control_vector")); }, same),
       {"metadata 'adapter.type'", "control_vector"}},
      {edited(
           [](GgufWriter& w) {
             w.set("adapter.alora.invocation_tokens", std::vector<uint32_t>{1, 2});
           },
           same),
       {"metadata 'adapter.alora.invocation_tokens'", "not supported"}},
  };
  const size_t n_params = model->named_parameters().size();
  for (const Case& c : cases) {
    const std::string msg =
        kiln_test::error_message([&] { models::load_lora(*model, cpu, c.path); });
    EXPECT_EQ(msg.rfind("[models] " + c.path + ": ", 0), 0u) << msg;
    for (const std::string& part : c.parts)
      EXPECT_NE(msg.find(part), std::string::npos) << "'" << part << "' not in: " << msg;
    EXPECT_TRUE(nn::lora_adapters(*model).empty()) << msg;
    EXPECT_EQ(model->named_parameters().size(), n_params);
  }
  // A model file is not an adapter; another base's adapter does not fit.
  models::save_gguf(*model, tmp.file("model.gguf"));
  EXPECT_KILN_ERROR(models::load_lora(*model, cpu, tmp.file("model.gguf")), "models",
                    "metadata 'general.type' is missing");
  Context c2;
  auto gpt2 = models::load_pretrained(c2, cpu, fixture_dir("gpt2"));
  EXPECT_KILN_ERROR(models::load_lora(*gpt2, cpu, good), "models",
                    "'general.architecture' is 'llama'", "base model is 'gpt2'");
  // A head tied to the embedding has no weight of its own in llama.cpp's files.
  nn::LoraConfig head;
  head.target_modules = {"lm_head"};
  nn::add_lora(*gpt2, cpu, head);
  EXPECT_KILN_ERROR(models::save_lora_gguf(*gpt2, tmp.file("head.gguf")), "models",
                    "layer 'lm_head'", "token embedding");
}

}  // namespace
}  // namespace kiln::test
