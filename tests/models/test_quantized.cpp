// Models with quantized Linear weights (ModelOptions::weight_dtype q8_0 / q4_0):
// which params are quantized (and frozen), logits within the formats' error of
// the f32 reference, and save_gguf / load_gguf keeping the blocks as they are.
#include <filesystem>

#include "common/temp_dir.h"
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
// random fixtures (width 32, where one block is a whole row): q8_0 0.014-0.030,
// q4_0 0.18-0.52; the bounds leave 2x room. The quantized model itself is exact
// to its dequantized weights (checked below to 1e-5).
double bound(DType q) { return q == q8_0 ? 0.06 : 1.0; }

TEST(ModelQuantized, LinearWeightsQuantizeAndLogitsStayClose) {
  for (const char* fixture : {"llama3_gqa", "qwen2_bias", "mistral_swa"})
    for (DType q : {q8_0, q4_0}) {
      Expected e(fixture);
      Context ctx;
      CpuBackend cpu(2);
      auto model = models::load_pretrained(ctx, cpu, fixture_dir(fixture), quantized(q));
      int n_quantized = 0;
      for (const auto& [name, p] : model->named_parameters()) {
        const bool linear =
            name.find("proj.weight") != std::string::npos || name == "lm_head.weight";
        // in_features 48 (down_proj) is no whole number of blocks: it stays f32.
        const bool want = linear && p.ndim() == 2 && p.size(-1) % 32 == 0;
        EXPECT_EQ(p.dtype(), want ? q : f32) << fixture << " " << name;
        EXPECT_EQ(p.requires_grad(), !want) << fixture << " " << name;
        n_quantized += want;
      }
      EXPECT_GE(n_quantized, 6) << fixture;
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
    EXPECT_EQ(f.tensor_info("token_embd.weight").dtype, f32);
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

}  // namespace
}  // namespace kiln::test
