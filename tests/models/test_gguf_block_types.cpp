// GGUF model files whose matrices are stored in each block type of
// kiln/quant_types.def (Q4_1, Q5_0, Q5_1, Q2_K .. Q6_K here; Q8_0 / Q4_0 in
// tests/models/test_quantized.cpp; llama.cpp's K-quant files mix them): on the
// CPU, load_gguf keeps them as stored (weight_dtype stored, and q8_0, which
// quantizes only f32 tensors) or dequantizes them to f32 (weight_dtype f32);
// every way the same model as the f32 file of the dequantized values: the same parameter values,
// and the same logits (exact up to f32 rounding over 6 tokens, within the rounding of x to 8-bit
// blocks for one token: qmatmul.h).
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "kiln/nn/lora.h"
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

// Logits of `model` (its params in ctx) for `ids` ([1, T]) on the CPU.
// llama_256 with random weights (seeded) saved as an f32 GGUF file.
void save_random_f32(const std::string& path, CpuBackend& cpu, uint64_t seed) {
  Context ctx;
  models::ModelOptions o;
  o.max_seq_len = 32;
  auto model = models::make_model(ctx, llama_256(), o);
  model->allocate(cpu);
  model->init(seed);
  models::save_gguf(*model, path);
}

std::vector<float> logits_of(Context& ctx, models::CausalLM& model,
                             const std::vector<int32_t>& ids) {
  Tensor in = ctx.input(i32, {1, int64_t(ids.size())}, "input_ids");
  model.eval();
  Tensor logits = model(in);
  Graph g = Graph::forward(logits);
  CpuBackend cpu(2);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  in.set(ids);
  cpu.compute(g);
  return logits.get<float>();
}

TEST(ModelGgufBlockTypes, KeptAsStoredDequantizedOrQuantizedAgain) {
  kiln_test::TempDir tmp;
  CpuBackend cpu(2);
  save_random_f32(tmp.file("f32.gguf"), cpu, 11);
  GgufFile src(tmp.file("f32.gguf"));
  for (const QuantType& qt : kQuantTypes) {
    if (qt.dtype == q8_0 || qt.dtype == q4_0) continue;  // tests/models/test_quantized.cpp
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
      const bool stored = wd == models::ModelOptions::WeightDType::stored;
      for (const auto& [name, p] : q->named_parameters()) {
        EXPECT_EQ(p.dtype(), stored && p.ndim() == 2 ? qt.dtype : f32) << what << " " << name;
        EXPECT_EQ(p.get<float>(), dq->parameter(name).get<float>()) << what << " " << name;
      }
      if (!stored) continue;
      // Read as stored by matmul and embedding: the dequantized model's logits.
      const std::vector<int32_t> prompt = {3, 17, 42, 5, 63, 8};
      EXPECT_LT(rel_error(logits_of(c, *q, prompt), logits_of(cd, *dq, prompt)), 1e-5) << what;
      EXPECT_LT(rel_error(logits_of(c, *q, {42}), logits_of(cd, *dq, {42})), 2e-2) << what;
    }
    // weight_dtype q8_0 quantizes the f32 tensors; the file's blocks, which
    // matmul reads, are kept as stored as with `stored`.
    Context c8;
    models::ModelOptions to_q8;
    to_q8.weight_dtype = models::ModelOptions::WeightDType::q8_0;
    auto q8 = models::load_gguf(c8, cpu, tmp.file("q.gguf"), to_q8);
    const Tensor wq = q8->parameter("model.layers.0.self_attn.q_proj.weight");
    ASSERT_EQ(wq.dtype(), qt.dtype) << what;
    EXPECT_EQ(wq.get<float>(), dq->parameter("model.layers.0.self_attn.q_proj.weight").get<float>())
        << what;
  }
}

// QLoRA on a K-quant base read from a GGUF file as stored: the adapters train
// through matmul's dy @ W on the blocks (the gradient with respect to x), the
// loss falls, the blocks do not change.
TEST(ModelGgufBlockTypes, LoraTrainsOnKQuantBases) {
  kiln_test::TempDir tmp;
  CpuBackend cpu(2);
  save_random_f32(tmp.file("f32.gguf"), cpu, 12);
  GgufFile src(tmp.file("f32.gguf"));
  for (DType qt : {q4_k, q6_k}) {
    GgufWriter quant;
    for (const auto& [k, v] : src.metadata()) quant.set(k, v);
    for (const GgufTensorInfo& t : src.tensors()) {
      const std::vector<uint8_t> raw = src.read_bytes(t.name);
      if (t.shape.ndim() != 2) {
        quant.add_tensor_data(t.name, t.dtype, t.shape, raw);
        continue;
      }
      const int64_t n = t.shape.numel();
      std::vector<float> x(static_cast<size_t>(n));
      std::memcpy(x.data(), raw.data(), raw.size());
      std::vector<uint8_t> blocks(dtype_row_bytes(qt, n));
      quantize_row(qt, x.data(), blocks.data(), n);
      quant.add_tensor_quantized(t.name, quant_type(qt).gguf_id, t.shape, blocks);
    }
    quant.save(tmp.file("q.gguf"));
    Context ctx;
    models::ModelOptions lo;
    lo.weight_dtype = models::ModelOptions::WeightDType::stored;
    lo.max_seq_len = 32;
    auto model = models::load_gguf(ctx, cpu, tmp.file("q.gguf"), lo);
    nn::LoraConfig lc;
    lc.r = 4;
    lc.alpha = 8;
    lc.target_modules = {"q_proj", "v_proj", "o_proj", "gate_proj", "down_proj"};
    nn::add_lora(*model, cpu, lc);
    std::map<std::string, std::vector<uint8_t>> blocks;
    for (const auto& [name, p] : model->named_parameters())
      if (is_quantized(p.dtype())) blocks[name] = p.get<uint8_t>();
    EXPECT_GE(blocks.size(), 7u) << dtype_name(qt);
    const int64_t T = 12, V = model->vocab_size();
    model->train();
    Tensor ids = ctx.input(i32, {1, T}, "input_ids");
    Tensor labels = ctx.input(i32, {T}, "labels");
    Tensor logits = (*model)(ids);
    OptConfig cfg;
    cfg.inputs = ids;
    cfg.outputs = logits;
    cfg.loss = LossKind::user;
    cfg.user_loss = cross_entropy(logits.reshape({T, V}), labels);
    cfg.model = model.get();
    cfg.backends = {&cpu};
    cfg.schedule = schedule::constant(OptimizerParams{}.set_lr(1e-2f));
    OptContext opt(cfg);
    std::vector<int32_t> x(T), y(T);
    for (int64_t t = 0; t < T; ++t) x[size_t(t)] = int32_t((t * 7 + 3) % V);
    for (int64_t t = 0; t < T; ++t) y[size_t(t)] = x[size_t((t + 1) % T)];
    double first = 0, last = 0;
    for (int step = 0; step < 25; ++step) {
      opt.inputs().set(x);
      labels.set(y);
      last = opt.train_batch();
      if (step == 0) first = last;
    }
    EXPECT_LT(last, 0.7 * first) << dtype_name(qt) << " loss " << first << " -> " << last;
    for (const auto& [name, p] : model->named_parameters())
      if (blocks.count(name)) EXPECT_EQ(p.get<uint8_t>(), blocks[name]) << name;
  }
}

}  // namespace
}  // namespace kiln::test
