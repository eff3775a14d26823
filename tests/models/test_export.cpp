// Export and re-import: a model written as a Hugging Face directory
// (save_pretrained) or as a GGUF file in llama.cpp's conventions (save_gguf) and
// read back gives the reference's logits; the GGUF layout is llama.cpp's.
#include <cmath>
#include <filesystem>

#include "common/temp_dir.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

const char* const kFixtures[] = {"llama3_gqa",       "llama_tied_bf16", "qwen2_bias",
                                 "qwen3_qknorm_f16", "mistral_swa",     "llama_yarn",
                                 "llama_linear",     "phi3_longrope",   "gpt2"};

class ModelExport : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelExport, HuggingFaceDirectoryRoundTrip) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam()));
  models::save_pretrained(*model, tmp.file("out"));
  auto back = models::load_pretrained(ctx, cpu, tmp.file("out"));
  Expected e(GetParam());
  EXPECT_LT(rel_error(run_logits(ctx, *back, e), e.floats("logits")), 1e-4);
  // The same weights, bit for bit (bf16/f16 values are exact in f32).
  for (const auto& [n, p] : model->named_parameters())
    EXPECT_EQ(p.get<float>(), back->parameter(n).get<float>()) << n;
  EXPECT_EQ(back->config().generation.eos_token_ids, model->config().generation.eos_token_ids);
  EXPECT_EQ(models::config_json(back->config()), models::config_json(model->config()));
}

TEST_P(ModelExport, GgufRoundTrip) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir(GetParam()));
  models::save_gguf(*model, tmp.file("model.gguf"));
  auto back = models::load_gguf(ctx, cpu, tmp.file("model.gguf"));
  Expected e(GetParam());
  EXPECT_LT(rel_error(run_logits(ctx, *back, e), e.floats("logits")), 1e-4);
  EXPECT_EQ(back->config().model_type, model->config().model_type);
  EXPECT_GT(back->load_stats.bytes_read, 0);
  EXPECT_GT(back->load_stats.peak_rss_bytes, 0);
  for (const auto& [n, p] : model->named_parameters())
    EXPECT_EQ(p.get<float>(), back->parameter(n).get<float>()) << n;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ModelExport, ::testing::ValuesIn(kFixtures));

// Reads a tensor of a GGUF file as floats.
std::vector<float> gguf_floats(const GgufFile& f, const std::string& name) {
  const std::vector<uint8_t> b = f.read_bytes(name);
  std::vector<float> v(b.size() / 4);
  std::memcpy(v.data(), b.data(), b.size());
  return v;
}

// HF's RoPE on one head vector x [D]: pairs (j, j + D/2).
std::vector<double> rope_halves(const std::vector<double>& x, double pos, double theta) {
  const size_t D = x.size(), half = D / 2;
  std::vector<double> y(D);
  for (size_t j = 0; j < half; ++j) {
    const double a = pos * std::pow(theta, -2.0 * double(j) / double(D));
    y[j] = x[j] * std::cos(a) - x[j + half] * std::sin(a);
    y[j + half] = x[j + half] * std::cos(a) + x[j] * std::sin(a);
  }
  return y;
}

// llama.cpp's RoPE for the llama architecture: pairs (2j, 2j + 1).
std::vector<double> rope_adjacent(const std::vector<double>& x, double pos, double theta) {
  const size_t D = x.size();
  std::vector<double> y(D);
  for (size_t j = 0; j < D / 2; ++j) {
    const double a = pos * std::pow(theta, -2.0 * double(j) / double(D));
    y[2 * j] = x[2 * j] * std::cos(a) - x[2 * j + 1] * std::sin(a);
    y[2 * j + 1] = x[2 * j + 1] * std::cos(a) + x[2 * j] * std::sin(a);
  }
  return y;
}

// The q/k rows of the llama architecture's GGUF are ordered so that llama.cpp's
// adjacent-pair RoPE of the file's q equals HF's half-split RoPE of HF's q, in
// the file's order: q . k scores (and so the model) are the same.
TEST(ModelGguf, LlamaQkRowsAreInLlamaCppOrder) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  models::save_gguf(*model, tmp.file("m.gguf"));
  GgufFile f(tmp.file("m.gguf"));
  EXPECT_EQ(f.get("general.architecture").as_string(), "llama");
  EXPECT_EQ(f.get("llama.block_count").as_int(), 2);
  EXPECT_EQ(f.get("llama.attention.head_count_kv").as_int(), 2);
  EXPECT_EQ(f.get("llama.rope.freq_base").as_float(), 10000.0);
  EXPECT_TRUE(f.find_tensor("rope_freqs.weight"));  // llama3 scaling, as llama.cpp stores it
  const int64_t D = 8, hidden = 32;
  for (const char* which : {"q", "k"}) {
    const std::vector<float> hf =
        model->parameter(std::string("model.layers.0.self_attn.") + which + "_proj.weight")
            .get<float>();
    const std::vector<float> file = gguf_floats(f, std::string("blk.0.attn_") + which + ".weight");
    ASSERT_EQ(hf.size(), file.size());
    EXPECT_NE(hf, file) << which << ": rows not reordered";
    const int64_t heads = int64_t(hf.size()) / (D * hidden);
    // Project a random input with both weights, head by head, rotate each its way.
    const std::vector<float> x = {0.3f,  -1.1f, 0.7f,  0.2f, -0.5f, 1.4f,  0.9f,  -0.8f,
                                  0.1f,  0.6f,  -1.3f, 0.4f, 1.0f,  -0.2f, 0.5f,  -0.7f,
                                  -0.9f, 0.8f,  0.3f,  1.2f, -0.4f, 0.0f,  0.6f,  -1.0f,
                                  0.2f,  -0.3f, 1.1f,  0.7f, -0.6f, 0.9f,  -1.2f, 0.4f};
    auto head_of = [&](const std::vector<float>& w, int64_t h) {
      std::vector<double> q(size_t(D), 0.0);
      for (int64_t r = 0; r < D; ++r)
        for (int64_t c = 0; c < hidden; ++c)
          q[size_t(r)] += double(w[size_t((h * D + r) * hidden + c)]) * double(x[size_t(c)]);
      return q;
    };
    for (int64_t h = 0; h < heads; ++h) {
      const std::vector<double> a = rope_halves(head_of(hf, h), 5.0, 10000.0);
      const std::vector<double> b = rope_adjacent(head_of(file, h), 5.0, 10000.0);
      // b is a in the file's order: file row 2j + s holds HF row s * D/2 + j.
      for (int64_t j = 0; j < D / 2; ++j)
        for (int64_t s = 0; s < 2; ++s)
          EXPECT_NEAR(b[size_t(2 * j + s)], a[size_t(s * D / 2 + j)], 1e-9) << which << h;
    }
  }
}

// Qwen2 keeps HF's row order (llama.cpp runs it with NeoX-style RoPE); GPT-2's
// Conv1D weights [in, out] are written [out, in], and the head as output.weight.
TEST(ModelGguf, Qwen2AndGpt2Layouts) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto qwen = models::load_pretrained(ctx, cpu, fixture_dir("qwen2_bias"));
  models::save_gguf(*qwen, tmp.file("q.gguf"));
  GgufFile fq(tmp.file("q.gguf"));
  EXPECT_EQ(fq.get("general.architecture").as_string(), "qwen2");
  EXPECT_EQ(gguf_floats(fq, "blk.1.attn_q.weight"),
            qwen->parameter("model.layers.1.self_attn.q_proj.weight").get<float>());
  EXPECT_TRUE(fq.find_tensor("blk.1.attn_k.bias"));
  EXPECT_FALSE(fq.find_tensor("output.weight"));  // tied

  auto gpt2 = models::load_pretrained(ctx, cpu, fixture_dir("gpt2"));
  models::save_gguf(*gpt2, tmp.file("g.gguf"));
  GgufFile fg(tmp.file("g.gguf"));
  const GgufTensorInfo& qkv = fg.tensor_info("blk.0.attn_qkv.weight");
  EXPECT_EQ(qkv.shape, Shape({96, 32}));
  const std::vector<float> hf = gpt2->parameter("h.0.attn.c_attn.weight").get<float>();  // [32, 96]
  const std::vector<float> file = gguf_floats(fg, "blk.0.attn_qkv.weight");
  EXPECT_EQ(file[size_t(5 * 32 + 7)], hf[size_t(7 * 96 + 5)]);
  EXPECT_EQ(gguf_floats(fg, "output.weight"), gguf_floats(fg, "token_embd.weight"));
  EXPECT_TRUE(fg.find_tensor("position_embd.weight"));
}

// Phi-3 as llama.cpp's phi3 files: q, k, v fused as attn_qkv and gate, up as
// ffn_up, in HF's row order (llama.cpp rotates the two halves, as HF), the
// rotary dims as rope.dimension_count, longrope as the rope_factors tensors.
TEST(ModelGguf, Phi3Layout) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto phi = models::load_pretrained(ctx, cpu, fixture_dir("phi3_longrope"));
  models::save_gguf(*phi, tmp.file("p.gguf"));
  GgufFile f(tmp.file("p.gguf"));
  EXPECT_EQ(f.get("general.architecture").as_string(), "phi3");
  EXPECT_EQ(f.get("phi3.rope.dimension_count").as_int(), 12);
  EXPECT_EQ(f.get("phi3.attention.key_length").as_int(), 16);
  EXPECT_EQ(f.get("phi3.rope.scaling.original_context_length").as_int(), 64);
  EXPECT_NEAR(f.get("phi3.rope.scaling.attn_factor").as_float(),
              std::sqrt(1 + std::log(4.0) / std::log(64.0)), 1e-6);
  EXPECT_EQ(f.tensor_info("blk.0.attn_qkv.weight").shape, Shape({128, 64}));  // (4 + 2 * 2) * 16
  EXPECT_EQ(gguf_floats(f, "blk.1.attn_qkv.weight"),
            phi->parameter("model.layers.1.self_attn.qkv_proj.weight").get<float>());
  EXPECT_EQ(gguf_floats(f, "blk.0.ffn_up.weight"),
            phi->parameter("model.layers.0.mlp.gate_up_proj.weight").get<float>());
  EXPECT_EQ(gguf_floats(f, "rope_factors_long.weight"),
            (std::vector<float>{1.0f, 1.5f, 2.5f, 4.0f, 8.0f, 16.0f}));
  EXPECT_EQ(gguf_floats(f, "rope_factors_short.weight").size(), 6u);
  EXPECT_FALSE(f.find_tensor("blk.0.attn_q.weight"));
  EXPECT_TRUE(f.find_tensor("output.weight"));  // untied
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// ggml's block layouts, quantized here (any valid quantization serves: the
// expected values are these blocks' own dequantization).
std::vector<uint8_t> quantize(const std::vector<float>& x, bool q8, std::vector<float>& back) {
  std::vector<uint8_t> out;
  back.clear();
  for (size_t b = 0; b < x.size() / 32; ++b) {
    float amax = 0;
    for (size_t i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const uint16_t dh = f32_to_f16(amax / (q8 ? 127.0f : 7.0f));
    const float d = f16_to_f32(dh);
    out.push_back(uint8_t(dh & 0xff));
    out.push_back(uint8_t(dh >> 8));
    auto q = [&](float v, int lo, int hi) {
      return d == 0 ? 0 : std::clamp(int(std::lround(v / d)), lo, hi);
    };
    const size_t at = back.size();
    back.resize(at + 32);
    if (q8) {
      for (size_t i = 0; i < 32; ++i) {
        const int v = q(x[b * 32 + i], -127, 127);
        out.push_back(uint8_t(int8_t(v)));
        back[at + i] = float(v) * d;
      }
    } else {
      for (size_t i = 0; i < 16; ++i) {
        const int lo = q(x[b * 32 + i], -8, 7), hi = q(x[b * 32 + i + 16], -8, 7);
        out.push_back(uint8_t((lo + 8) | ((hi + 8) << 4)));
        back[at + i] = float(lo) * d;
        back[at + i + 16] = float(hi) * d;
      }
    }
  }
  return out;
}

// A llama.cpp-style GGUF with Q8_0 attention and Q4_0 MLP weights loads as the
// same file with those values dequantized and stored as f32 would.
TEST(ModelGguf, QuantizedTensorsAreDequantizedOnLoad) {
  kiln_test::TempDir tmp;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::load_pretrained(ctx, cpu, fixture_dir("llama3_gqa"));
  models::save_gguf(*model, tmp.file("f32.gguf"));
  GgufFile src(tmp.file("f32.gguf"));
  for (const bool mlp_q4 : {false, true}) {
    GgufWriter quant, dequant;
    int n_quant = 0;
    for (const auto& [k, v] : src.metadata()) {
      quant.set(k, v);
      dequant.set(k, v);
    }
    for (const GgufTensorInfo& t : src.tensors()) {
      const std::vector<uint8_t> raw = src.read_bytes(t.name);
      const bool eligible = t.shape.ndim() == 2 && t.shape[1] % 32 == 0;
      if (!eligible) {
        quant.add_tensor_data(t.name, t.dtype, t.shape, raw);
        dequant.add_tensor_data(t.name, t.dtype, t.shape, raw);
        continue;
      }
      std::vector<float> x(raw.size() / 4), back;
      std::memcpy(x.data(), raw.data(), raw.size());
      const bool q8 = !(mlp_q4 && t.name.find("ffn_") != std::string::npos);
      quant.add_tensor_quantized(t.name, q8 ? 8 : 2, t.shape, quantize(x, q8, back));
      dequant.add_tensor_data(t.name, f32, t.shape,
                              {reinterpret_cast<const uint8_t*>(back.data()), back.size() * 4});
      ++n_quant;
    }
    EXPECT_GE(n_quant, 8);
    quant.save(tmp.file("q.gguf"));
    dequant.save(tmp.file("dq.gguf"));
    auto q = models::load_gguf(ctx, cpu, tmp.file("q.gguf"));
    auto dq = models::load_gguf(ctx, cpu, tmp.file("dq.gguf"));
    for (const auto& [n, p] : q->named_parameters())
      EXPECT_EQ(p.get<float>(), dq->parameter(n).get<float>()) << n;
    if (!mlp_q4) {  // Q8_0 alone stays near the f32 model (measured: 3.7% of the scale)
      Expected e("llama3_gqa");
      EXPECT_LT(rel_error(run_logits(ctx, *q, e), e.floats("logits")), 0.1);
    }
  }
}

}  // namespace
}  // namespace kiln::test
