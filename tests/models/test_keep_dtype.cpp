// Weights kept as stored (ModelOptions::weight_dtype = stored): f16/bf16
// matrices stay f16/bf16 (embedding, projections, tied heads, GPT-2's Conv1D and
// positions), 1-D params become f32, and the logits equal the reference computed
// from the same rounded weights; mapped or copied, HF or GGUF.
#include <algorithm>
#include <cstring>
#include <filesystem>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/nn/lora.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

models::ModelOptions stored(bool mmap) {
  models::ModelOptions o;
  o.weight_dtype = models::ModelOptions::WeightDType::stored;
  o.mmap = mmap;
  return o;
}

// The PyTorch fixtures stored as BF16 and F16: kept, their logits are the
// reference's (computed from the stored values) within f32 accumulation error.
TEST(ModelKeepDtype, HalfFixturesMatchTheReference) {
  for (const char* fixture : {"llama_tied_bf16", "qwen3_qknorm_f16"}) {
    const DType half = std::string(fixture) == "llama_tied_bf16" ? bf16 : f16;
    Expected e(fixture);
    for (bool mmap : {true, false}) {
      Context ctx;
      CpuBackend cpu(1);
      auto model = models::load_pretrained(ctx, cpu, fixture_dir(fixture), stored(mmap));
      for (const auto& [name, p] : model->named_parameters())
        EXPECT_EQ(p.dtype(), p.ndim() >= 2 ? half : f32) << fixture << " " << name;
      EXPECT_EQ(model->load_stats.bytes_mapped > 0, mmap) << fixture;
      EXPECT_LT(rel_error(run_logits(ctx, *model, e), e.floats("logits")), 1e-4)
          << fixture << (mmap ? " mapped" : " copied");
    }
  }
  // The tied head is the (bf16) embedding itself.
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama_tied_bf16"), stored(true));
  Tensor emb = model->parameter("model.embed_tokens.weight");
  EXPECT_EQ(model->parameter("lm_head.weight").node(), emb.node());
  EXPECT_EQ(emb.dtype(), bf16);
  // Saved: the kept matrices as they were stored (bytes equal), GGUF as f32.
  kiln_test::TempDir tmp;
  models::save_pretrained(*model, tmp.str());
  SafetensorsFile orig(fixture_dir("llama_tied_bf16") + "/model.safetensors");
  SafetensorsFile saved(tmp.file("model.safetensors"));
  for (const auto& [name, p] : model->named_parameters()) {
    ASSERT_NE(saved.find(name), nullptr) << name;
    EXPECT_EQ(saved.find(name)->file_dtype, p.ndim() >= 2 ? "BF16" : "F32") << name;
    if (p.ndim() >= 2) EXPECT_TRUE(saved.read_bytes(name) == orig.read_bytes(name)) << name;
  }
  models::save_gguf(*model, tmp.file("m.gguf"));
  Expected e("llama_tied_bf16");
  auto back = models::load_gguf(ctx, cpu, tmp.file("m.gguf"));
  EXPECT_LT(rel_error(run_logits(ctx, *back, e), e.floats("logits")), 1e-4);
}

// A fixture's weights rounded to `half` and written as a HF directory.
void write_half_copy(const std::string& fixture, DType half, const std::string& dir) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(fixture));
  Context out;
  std::vector<std::pair<std::string, std::vector<float>>> values;
  std::vector<NamedTensor> tensors;
  for (const auto& [name, p] : model->named_parameters()) {
    tensors.push_back({name, out.tensor(half, p.shape(), name)});
    values.emplace_back(name, p.get<float>());
  }
  std::unique_ptr<Buffer> buf = allocate_tensors(out, cpu);
  for (size_t i = 0; i < tensors.size(); ++i) {
    std::vector<uint16_t> h;
    for (float v : values[i].second) h.push_back(half == bf16 ? f32_to_bf16(v) : f32_to_f16(v));
    tensors[i].tensor.set(h);
  }
  fs::create_directories(dir);
  save_safetensors(dir + "/model.safetensors", tensors);
  fs::copy_file(fixture_dir(fixture) + "/config.json", dir + "/config.json");
}

// Every architecture from BF16/F16 files: the kept model's logits equal those
// of the same file converted to f32 (the path the PyTorch tests prove), and its
// gradients too: backward through f16/bf16 weights gives f32 gradients.
TEST(ModelKeepDtype, EveryArchitectureFromHalfFiles) {
  kiln_test::TempDir tmp;
  for (const char* fixture : {"llama3_gqa", "qwen2_bias", "mistral_swa", "gpt2"}) {
    for (DType half : {bf16, f16}) {
      const std::string dir = tmp.file(std::string(fixture) + "_" + dtype_name(half));
      write_half_copy(fixture, half, dir);
      Expected e(fixture);
      const std::vector<int64_t> d = e.dims("input_ids");
      std::vector<float> logits[2], grads[2];
      for (int keep = 0; keep < 2; ++keep) {
        Context ctx;
        CpuBackend cpu(1);
        auto model =
            models::load_pretrained(ctx, cpu, dir, keep ? stored(true) : models::ModelOptions{});
        const int64_t B = d[0], T = d[1], V = model->vocab_size();
        model->eval();
        Tensor ids = ctx.input(i32, {B, T}, "input_ids");
        Tensor labels = ctx.input(i32, {B * T}, "labels");
        Tensor out = (*model)(ids);
        Tensor loss = cross_entropy(out.reshape({B * T, V}), labels);
        Graph g = Graph::forward({loss, out});
        g.backward(loss);
        GraphAllocator galloc(cpu.buffer_type());
        galloc.alloc(g);
        g.reset_grads();
        ids.set(e.ints("input_ids"));
        std::vector<int32_t> next = e.ints("input_ids");  // any labels in range do
        std::rotate(next.begin(), next.begin() + 1, next.end());
        labels.set(next);
        cpu.compute(g);
        logits[keep] = out.get<float>();
        // The embedding's gradient (a matrix, kept as stored when keep is set).
        const std::string emb =
            std::string(fixture) == "gpt2" ? "wte.weight" : "model.embed_tokens.weight";
        EXPECT_EQ(model->parameter(emb).dtype(), keep ? half : f32) << fixture;
        grads[keep] = g.grad(model->parameter(emb)).get<float>();
      }
      const std::string what = std::string(fixture) + " " + dtype_name(half);
      EXPECT_LT(rel_error(logits[1], logits[0]), 1e-5) << what;
      EXPECT_LT(rel_error(grads[1], grads[0]), 1e-4) << what;
      // Rounding the weights moves the logits a little from the f32 reference.
      EXPECT_LT(rel_error(logits[1], e.floats("logits")), 0.05) << what;
    }
  }
}

// GGUF files with f16 matrices: kept as stored through llama.cpp's q/k row
// order (rows move, values stay f16) and GPT-2's transposed weights.
TEST(ModelKeepDtype, GgufHalfTensors) {
  kiln_test::TempDir tmp;
  for (const char* fixture : {"llama3_gqa", "gpt2"}) {
    const std::string f32_path = tmp.file(std::string(fixture) + ".gguf");
    const std::string half_path = tmp.file(std::string(fixture) + "_f16.gguf");
    {
      Context ctx;
      CpuBackend cpu(1);
      models::save_gguf(*models::load_pretrained(ctx, cpu, fixture_dir(fixture)), f32_path);
    }
    // The same file with every matrix as f16.
    GgufFile src(f32_path);
    GgufWriter w;
    for (const auto& [k, v] : src.metadata()) w.set(k, v);
    for (const GgufTensorInfo& t : src.tensors()) {
      const std::vector<uint8_t> raw = src.read_bytes(t.name);
      if (t.shape.ndim() < 2) {
        w.add_tensor_data(t.name, t.dtype, t.shape, raw);
        continue;
      }
      std::vector<uint16_t> h(raw.size() / 4);
      for (size_t i = 0; i < h.size(); ++i) {
        float x;
        std::memcpy(&x, raw.data() + 4 * i, 4);
        h[i] = f32_to_f16(x);
      }
      w.add_tensor_data(t.name, f16, t.shape,
                        {reinterpret_cast<const uint8_t*>(h.data()), h.size() * 2});
    }
    w.save(half_path);
    Expected e(fixture);
    Context ctx;
    CpuBackend cpu(1);
    auto kept = models::load_gguf(ctx, cpu, half_path, stored(true));
    auto converted = models::load_gguf(ctx, cpu, half_path);
    for (const auto& [name, p] : kept->named_parameters())
      EXPECT_EQ(p.dtype(), p.ndim() >= 2 ? f16 : f32) << fixture << " " << name;
    EXPECT_GT(kept->load_stats.bytes_mapped, 0) << fixture;
    const std::vector<float> a = run_logits(ctx, *kept, e), b = run_logits(ctx, *converted, e);
    EXPECT_LT(rel_error(a, b), 1e-5) << fixture;
    EXPECT_LT(rel_error(a, e.floats("logits")), 0.05) << fixture;
  }
}

// The optimizers update f32 params: training kept f16/bf16 weights is refused
// when the OptContext is built, naming a param (gradients themselves work, see
// above).
TEST(ModelKeepDtype, OptimizerStepsNeedF32) {
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama_tied_bf16"), stored(true));
  Expected e("llama_tied_bf16");
  const std::vector<int64_t> d = e.dims("input_ids");
  const int64_t B = d[0], T = d[1], V = model->vocab_size();
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
  EXPECT_TRUE(kiln_test::is_error(kiln_test::error_message([&] { OptContext opt(cfg); }), "opt",
                                  {"is bf16", "optimizers update f32 params"}));
}

// WeightDType::bf16 rounds f32 files' matrices to bf16 as they load (to
// nearest even; 1-D params stay f32), from safetensors and from GGUF (through
// llama.cpp's q/k row order and GPT-2's transposes: the same model bit for bit).
TEST(ModelKeepDtype, Bf16WeightDtypeRoundsF32Files) {
  kiln_test::TempDir tmp;
  for (const char* fixture : {"llama3_gqa", "gpt2"}) {
    Expected e(fixture);
    models::ModelOptions to_bf16;
    to_bf16.weight_dtype = models::ModelOptions::WeightDType::bf16;
    Context ctx;
    CpuBackend cpu(1);
    auto f32_model = models::load_pretrained(ctx, cpu, fixture_dir(fixture));
    auto hf = models::load_pretrained(ctx, cpu, fixture_dir(fixture), to_bf16);
    for (const auto& [name, p] : hf->named_parameters()) {
      const std::vector<float> v = f32_model->parameter(name).get<float>();
      if (p.ndim() < 2) {
        EXPECT_EQ(p.dtype(), f32) << fixture << " " << name;
        EXPECT_EQ(p.get<float>(), v) << fixture << " " << name;
        continue;
      }
      ASSERT_EQ(p.dtype(), bf16) << fixture << " " << name;
      std::vector<uint16_t> want;
      for (float x : v) want.push_back(f32_to_bf16(x));
      EXPECT_EQ(p.get<uint16_t>(), want) << fixture << " " << name;
    }
    const std::vector<float> logits = run_logits(ctx, *hf, e);
    EXPECT_LT(rel_error(logits, e.floats("logits")), 0.05) << fixture;
    const std::string gguf = tmp.file(std::string(fixture) + ".gguf");
    models::save_gguf(*f32_model, gguf);
    auto gg = models::load_gguf(ctx, cpu, gguf, to_bf16);
    EXPECT_EQ(run_logits(ctx, *gg, e), logits) << fixture << " from GGUF";
  }
}

// A LoRA merge onto bf16 weights keeps the merged weight f32: a delta far
// below the bf16 step of the weight survives (rounded back, it would vanish).
TEST(ModelKeepDtype, LoraMergeOntoBf16WeightsKeepsF32) {
  models::ModelOptions to_bf16;
  to_bf16.weight_dtype = models::ModelOptions::WeightDType::bf16;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"), to_bf16);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  std::vector<float> before;
  for (uint16_t h : model->parameter(q).get<uint16_t>()) before.push_back(bf16_to_f32(h));
  nn::LoraConfig lc;
  lc.r = 1;
  lc.alpha = 1;
  lc.target_modules = {"q_proj"};
  nn::add_lora(*model, cpu, lc);
  for (auto [name, p] : model->named_parameters()) {  // delta = 1e-6 * 1 * 1 per value
    if (name.find("lora_A") != std::string::npos)
      p.set(std::vector<float>(size_t(p.numel()), 1.0f));
    if (name.find("lora_B") != std::string::npos)
      p.set(std::vector<float>(size_t(p.numel()), 1e-6f));
  }
  const nn::MergeReport r = nn::merge_lora(*model);
  EXPECT_EQ(r.kept_f32, 2);  // two layers' q_proj
  Tensor w = model->parameter(q);
  ASSERT_EQ(w.dtype(), f32);
  const std::vector<float> after = w.get<float>();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) ASSERT_NEAR(after[i] - before[i], 1e-6f, 1e-7f) << i;
}

}  // namespace
}  // namespace kiln::test
