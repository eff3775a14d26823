// Models with quantized Linear weights and token embedding
// (ModelOptions::weight_dtype q8_0 / q4_0): which params are quantized (and
// frozen), logits within the formats' error of the f32 reference, and
// save_gguf / load_gguf keeping the blocks as they are.
#include <filesystem>

#include "common/temp_dir.h"
#include "kiln/nn/lora.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

models::ModelOptions quantized(DType q, bool mmap = true) {
  models::ModelOptions o;
  o.weight_dtype =
      q == q8_0 ? models::ModelOptions::WeightDType::q8_0 : models::ModelOptions::WeightDType::q4_0;
  o.mmap = mmap;
  return o;
}

// Relative logit error against the f32 reference measured on these tiny
// random fixtures (width 32, where one block is a whole row; the embedding is
// quantized too): q8_0 0.015-0.039, q4_0 0.25-0.68; the bounds leave 2x room.
// The quantized model itself is exact to its dequantized weights (checked
// below to 1e-5).
double bound(DType q) { return q == q8_0 ? 0.08 : 1.4; }

TEST(ModelQuantized, LinearWeightsQuantizeAndLogitsStayClose) {
  for (const char* fixture : {"llama3_gqa", "qwen2_bias", "mistral_swa"})
    for (DType q : {q8_0, q4_0}) {
      Expected e(fixture);
      Context ctx;
      CpuBackend cpu(2);
      auto model = models::load_pretrained(ctx, cpu, fixture_dir(fixture), quantized(q));
      int n_quantized = 0;
      for (const auto& [name, p] : model->named_parameters()) {
        const bool linear = name.find("proj.weight") != std::string::npos ||
                            name == "lm_head.weight" || name == "model.embed_tokens.weight";
        // in_features 48 (down_proj) is no whole number of blocks: it stays f32.
        const bool want = linear && p.ndim() == 2 && p.size(-1) % 32 == 0;
        EXPECT_EQ(p.dtype(), want ? q : f32) << fixture << " " << name;
        EXPECT_EQ(p.requires_grad(), !want) << fixture << " " << name;
        n_quantized += want;
      }
      EXPECT_GE(n_quantized, 7) << fixture;
      // The embedding (tied to the head in qwen2_bias) is quantized too.
      EXPECT_EQ(model->parameter("model.embed_tokens.weight").dtype(), q) << fixture;
      EXPECT_EQ(model->parameter("lm_head.weight").dtype(), q) << fixture;
      const double err = rel_error(run_logits(ctx, *model, e), e.floats("logits"));
      EXPECT_LT(err, bound(q)) << fixture << " " << dtype_name(q);
      EXPECT_GT(err, 1e-6) << fixture << " " << dtype_name(q);  // it did quantize
      // The same model in f32 with the dequantized weights: the same logits.
      Context c2;
      auto ref = models::load_pretrained(c2, cpu, fixture_dir(fixture));
      for (const auto& [name, p] : model->named_parameters())
        if (is_quantized(p.dtype())) ref->parameter(name).set(p.get<float>());
      EXPECT_LT(rel_error(run_logits(ctx, *model, e), run_logits(c2, *ref, e)), 1e-5)
          << fixture << " " << dtype_name(q);
    }
}

// save_gguf writes the blocks as they are (q/k rows reordered as bytes for
// llama.cpp), load_gguf keeps them (weight_dtype stored or q*) or dequantizes
// them (f32): the same logits either way.
TEST(ModelQuantized, GgufRoundTripKeepsTheBlocks) {
  for (DType q : {q8_0, q4_0}) {
    kiln_test::TempDir tmp;
    Expected e("llama3_gqa");
    Context ctx;
    CpuBackend cpu(2);
    auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"), quantized(q));
    const std::vector<float> want = run_logits(ctx, *model, e);
    models::save_gguf(*model, tmp.file("q.gguf"));
    GgufFile f(tmp.file("q.gguf"));
    EXPECT_EQ(f.tensor_info("blk.0.attn_q.weight").dtype, q);
    EXPECT_EQ(f.tensor_info("blk.0.ffn_down.weight").dtype, f32);
    EXPECT_EQ(f.tensor_info("token_embd.weight").dtype, q);
    EXPECT_EQ(f.tensor_info("output.weight").dtype, q);
    for (bool mmap : {true, false}) {
      models::ModelOptions stored;
      stored.weight_dtype = models::ModelOptions::WeightDType::stored;
      stored.mmap = mmap;
      Context c2;
      auto back = models::load_gguf(c2, cpu, tmp.file("q.gguf"), stored);
      for (const auto& [name, p] : model->named_parameters()) {
        const Tensor b = back->parameter(name);
        ASSERT_EQ(b.dtype(), p.dtype()) << name;
        if (is_quantized(p.dtype())) EXPECT_EQ(b.get<uint8_t>(), p.get<uint8_t>()) << name;
      }
      EXPECT_EQ(run_logits(c2, *back, e), want) << (mmap ? "mapped" : "copied");
    }
    Context c3;
    auto deq = models::load_gguf(c3, cpu, tmp.file("q.gguf"));  // f32: dequantized
    EXPECT_EQ(deq->parameter("model.layers.0.self_attn.q_proj.weight").dtype(), f32);
    EXPECT_LT(rel_error(run_logits(c3, *deq, e), want), 1e-5);
  }
}

// QLoRA: LoRA adapters on a q8_0 / q4_0 base train with the ordinary training
// API; the base's blocks do not change, the adapters do, the loss falls. Merged,
// the base weight is dequantized and kept f32 (logits equal the unmerged model's)
// or re-quantized (the report's error within the format's rounding bound).
TEST(ModelQuantized, LoraOnAQuantizedBaseTrainsAndMerges) {
  for (DType q : {q8_0, q4_0}) {
    Context ctx;
    CpuBackend cpu(2);
    auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"), quantized(q));
    nn::LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.target_modules = {"q_proj", "v_proj", "o_proj", "gate_proj"};
    nn::add_lora(*model, cpu, lc);
    std::map<std::string, std::vector<uint8_t>> blocks;
    std::map<std::string, std::vector<float>> before;
    for (const auto& [name, p] : model->named_parameters()) {
      if (is_quantized(p.dtype())) blocks[name] = p.get<uint8_t>();
      else before[name] = p.get<float>();
    }
    Expected e("llama3_gqa");
    const std::vector<int64_t> d = e.dims("input_ids");
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
    const std::vector<int32_t> x = e.ints("input_ids");
    std::vector<int32_t> y(x.size());
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        y[size_t(b * T + t)] = t + 1 < T ? x[size_t(b * T + t + 1)] : 0;
    double first = 0, last = 0;
    for (int step = 0; step < 30; ++step) {
      opt.inputs().set(x);
      labels.set(y);
      last = opt.train_batch();
      if (step == 0) first = last;
    }
    EXPECT_LT(last, 0.7 * first) << dtype_name(q) << " loss " << first << " -> " << last;
    EXPECT_GE(blocks.size(), 6u);
    int changed = 0;
    for (const auto& [name, p] : model->named_parameters()) {
      if (blocks.count(name)) EXPECT_EQ(p.get<uint8_t>(), blocks[name]) << name;
      const bool adapter = name.find("lora_") != std::string::npos;
      if (!blocks.count(name) && !adapter) EXPECT_EQ(p.get<float>(), before[name]) << name;
      if (adapter && p.get<float>() != before[name]) ++changed;
    }
    EXPECT_GT(changed, 0);

    // Merge in f32 (default): the merged f32 weights give the adapter model's logits.
    model->eval();
    const std::vector<float> with_adapter = run_logits(ctx, *model, e);
    const nn::MergeReport kept = nn::merge_lora(*model);
    EXPECT_EQ(kept.kept_f32, 8);  // 4 targets x 2 layers
    EXPECT_EQ(kept.requantized, 0);
    EXPECT_EQ(model->parameter("model.layers.0.self_attn.q_proj.weight").dtype(), f32);
    EXPECT_EQ(model->parameter("model.layers.0.self_attn.k_proj.weight").dtype(), q);
    EXPECT_LT(rel_error(run_logits(ctx, *model, e), with_adapter), 1e-5) << dtype_name(q);
  }
  // Re-quantized on request: the report gives the rounding error it added.
  for (DType q : {q8_0, q4_0}) {
    Context ctx;
    CpuBackend cpu(2);
    auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"), quantized(q));
    nn::LoraConfig lc;
    lc.target_modules = {"q_proj"};
    nn::add_lora(*model, cpu, lc);
    for (auto [name, p] : model->named_parameters())  // B = 0 would merge nothing
      if (name.find("lora_B") != std::string::npos)
        p.set(std::vector<float>(size_t(p.numel()), 0.01f));
    nn::MergeOptions mo;
    mo.requantize = true;
    const nn::MergeReport r = nn::merge_lora(*model, mo);
    EXPECT_EQ(r.requantized, 2);
    EXPECT_EQ(r.kept_f32, 0);
    EXPECT_EQ(model->parameter("model.layers.0.self_attn.q_proj.weight").dtype(), q);
    EXPECT_GT(r.max_error, 0.0);
    // Per value at most half a step (q8_0: d / 2, d <= max|w| / 127) or a step
    // (q4_0: d <= max|w| / 8), plus the f16 rounding of d times the quant
    // (127 or 8 times 2^-11 of d).
    EXPECT_LE(r.max_error, r.max_abs_merged * (q == q8_0 ? 0.57 / 127 : 1.01 / 8));
    EXPECT_GT(r.rms_error(), 0.0);
    EXPECT_LE(r.rms_error(), r.max_error);
  }
}

}  // namespace
}  // namespace kiln::test
