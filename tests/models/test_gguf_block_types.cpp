// GGUF model files whose matrices are stored in the block types matmul does
// not read as stored yet (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K; llama.cpp's K-quant
// files mix them with Q8_0): load_gguf dequantizes them to f32 as they load
// (also with weight_dtype stored), or quantizes the dequantized values again
// to weight_dtype's type (q8_0 / q4_0); the same model as the f32 file of the
// dequantized values.
#include <cstring>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

// Rows of 256 and 512 values, so every type's blocks fit the matrices.
models::ModelConfig llama_256() {
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 1;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 32;
  c.tie_word_embeddings = false;
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  return cfg;
}

TEST(ModelGgufBlockTypes, DequantizedOnLoadOrQuantizedAgain) {
  kiln_test::TempDir tmp;
  CpuBackend cpu(2);
  Context c0;
  models::ModelOptions o;
  o.max_seq_len = 32;
  auto src_model = models::make_model(c0, llama_256(), o);
  src_model->allocate(cpu);
  src_model->init(11);
  models::save_gguf(*src_model, tmp.file("f32.gguf"));
  GgufFile src(tmp.file("f32.gguf"));
  for (const QuantType& qt : kQuantTypes) {
    if (qt.matmul_reads) continue;  // kept as stored: tests/models/test_quantized.cpp
    const std::string what = qt.name;
    // Every matrix in qt (the embedding too), and the f32 file of its values.
    GgufWriter quant, dequant;
    for (const auto& [k, v] : src.metadata()) {
      quant.set(k, v);
      dequant.set(k, v);
    }
    int n_quant = 0;
    for (const GgufTensorInfo& t : src.tensors()) {
      const std::vector<uint8_t> raw = src.read_bytes(t.name);
      if (t.shape.ndim() != 2) {
        quant.add_tensor_data(t.name, t.dtype, t.shape, raw);
        dequant.add_tensor_data(t.name, t.dtype, t.shape, raw);
        continue;
      }
      const int64_t n = t.shape.numel();
      std::vector<float> x(static_cast<size_t>(n)), back(static_cast<size_t>(n));
      std::memcpy(x.data(), raw.data(), raw.size());
      std::vector<uint8_t> blocks(dtype_row_bytes(qt.dtype, n));
      quantize_row(qt.dtype, x.data(), blocks.data(), n);
      dequantize_row(qt.dtype, blocks.data(), back.data(), n);
      quant.add_tensor_quantized(t.name, qt.gguf_id, t.shape, blocks);
      dequant.add_tensor_data(t.name, f32, t.shape,
                              {reinterpret_cast<const uint8_t*>(back.data()), back.size() * 4});
      ++n_quant;
    }
    ASSERT_GE(n_quant, 8) << what;
    quant.save(tmp.file("q.gguf"));
    dequant.save(tmp.file("dq.gguf"));
    Context cd;
    auto dq = models::load_gguf(cd, cpu, tmp.file("dq.gguf"));
    for (models::ModelOptions::WeightDType wd :
         {models::ModelOptions::WeightDType::f32, models::ModelOptions::WeightDType::stored}) {
      Context c;
      models::ModelOptions lo;
      lo.weight_dtype = wd;
      auto q = models::load_gguf(c, cpu, tmp.file("q.gguf"), lo);
      for (const auto& [name, p] : q->named_parameters()) {
        EXPECT_EQ(p.dtype(), f32) << what << " " << name;
        EXPECT_EQ(p.get<float>(), dq->parameter(name).get<float>()) << what << " " << name;
      }
    }
    // weight_dtype q8_0: the dequantized values quantized again.
    Context c8;
    models::ModelOptions to_q8;
    to_q8.weight_dtype = models::ModelOptions::WeightDType::q8_0;
    auto q8 = models::load_gguf(c8, cpu, tmp.file("q.gguf"), to_q8);
    const Tensor wq = q8->parameter("model.layers.0.self_attn.q_proj.weight");
    ASSERT_EQ(wq.dtype(), q8_0) << what;
    const std::vector<float> deq =
        dq->parameter("model.layers.0.self_attn.q_proj.weight").get<float>();
    std::vector<uint8_t> want(dtype_row_bytes(q8_0, int64_t(deq.size())));
    // Llama's q/k rows are stored permuted for llama.cpp's rope in GGUF; the
    // param holds them in Hugging Face order, as dq's f32 param does.
    quantize_row(q8_0, deq.data(), want.data(), int64_t(deq.size()));
    EXPECT_EQ(wq.get<uint8_t>(), want) << what;
  }
}

}  // namespace
}  // namespace kiln::test
