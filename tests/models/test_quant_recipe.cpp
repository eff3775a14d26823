// llama.cpp's quantization recipes (models::quant_recipe_types, save_gguf with
// a recipe): the type of every tensor under every recipe equals what
// llama.cpp's llama_tensor_get_type gives, written out here by hand from its
// rules (the use-more-bits layers listed, not computed): a 16-layer model whose
// rows are whole blocks of 256, a SmolLM2-like one whose 576-wide rows fall
// back to 32-value types, rows of 48 that fall back to F16, GPT-2's tensors,
// and a file written with a recipe that kiln loads back as stored.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/temp_dir.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

using models::RecipeTensor;

// A Llama-style model's GGUF tensors, listed in name order (so "blk.10" comes
// before "blk.2": the recipe must walk layers in number order itself).
std::vector<RecipeTensor> llama_tensors(int64_t layers, int64_t hidden, int64_t kv, int64_t ffn,
                                        int64_t vocab, bool tied) {
  std::map<std::string, Shape> t;
  t["token_embd.weight"] = Shape({vocab, hidden});
  t["output_norm.weight"] = Shape({hidden});
  if (!tied) t["output.weight"] = Shape({vocab, hidden});
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    t[p + "attn_norm.weight"] = Shape({hidden});
    t[p + "attn_q.weight"] = Shape({hidden, hidden});
    t[p + "attn_k.weight"] = Shape({kv, hidden});
    t[p + "attn_v.weight"] = Shape({kv, hidden});
    t[p + "attn_output.weight"] = Shape({hidden, hidden});
    t[p + "ffn_norm.weight"] = Shape({hidden});
    t[p + "ffn_gate.weight"] = Shape({ffn, hidden});
    t[p + "ffn_up.weight"] = Shape({ffn, hidden});
    t[p + "ffn_down.weight"] = Shape({hidden, ffn});
  }
  std::vector<RecipeTensor> out;
  for (const auto& [name, shape] : t) out.push_back({name, shape});
  return out;
}

// GGUF name -> type name under `recipe`.
std::map<std::string, std::string> types_of(const std::string& recipe, const models::RecipeModel& m,
                                            const std::vector<RecipeTensor>& tensors) {
  const std::vector<DType> types = models::quant_recipe_types(recipe, m, tensors);
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < tensors.size(); ++i) out[tensors[i].name] = dtype_name(types[i]);
  return out;
}

// What a recipe gives one layer's matrices and the model's ends.
struct Expect {
  std::string embd, output;  // token_embd, output (empty: no output tensor)
  std::string q, k, o, gate, up;
  std::vector<std::string> v, down;  // per layer
};

void check(const std::string& recipe, const std::map<std::string, std::string>& got,
           const Expect& e, int64_t layers) {
  SCOPED_TRACE(recipe);
  EXPECT_EQ(got.at("token_embd.weight"), e.embd);
  if (!e.output.empty()) EXPECT_EQ(got.at("output.weight"), e.output);
  EXPECT_EQ(got.at("output_norm.weight"), "f32");
  for (int64_t l = 0; l < layers; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    SCOPED_TRACE(p);
    EXPECT_EQ(got.at(p + "attn_norm.weight"), "f32");
    EXPECT_EQ(got.at(p + "ffn_norm.weight"), "f32");
    EXPECT_EQ(got.at(p + "attn_q.weight"), e.q);
    EXPECT_EQ(got.at(p + "attn_k.weight"), e.k);
    EXPECT_EQ(got.at(p + "attn_output.weight"), e.o);
    EXPECT_EQ(got.at(p + "ffn_gate.weight"), e.gate);
    EXPECT_EQ(got.at(p + "ffn_up.weight"), e.up);
    EXPECT_EQ(got.at(p + "attn_v.weight"), e.v[size_t(l)]);
    EXPECT_EQ(got.at(p + "ffn_down.weight"), e.down[size_t(l)]);
  }
}

// `yes` at the listed layers, `no` at the others.
std::vector<std::string> at(const std::set<int>& layers, const std::string& yes,
                            const std::string& no, int n) {
  std::vector<std::string> out;
  for (int l = 0; l < n; ++l) out.push_back(layers.count(l) ? yes : no);
  return out;
}

Expect uniform(const std::string& t, const std::string& embd, const std::string& output, int n) {
  return {embd, output, t, t, t, t, t, at({}, t, t, n), at({}, t, t, n)};
}

TEST(QuantRecipe, SixteenLayersOfWholeBlocks) {
  // 16 layers, rows of 256 / 512, 8 heads over 2 key-value heads (n_gqa 4), untied.
  const int n = 16;
  const auto tensors = llama_tensors(n, 256, 64, 512, 1000, false);
  const models::RecipeModel m{n, 4, false};
  // llama.cpp's use_more_bits layers of 16: the first and last two, and
  // 4, 7, 10, 13 (every third after the first eighth).
  const std::set<int> more = {0, 1, 4, 7, 10, 13, 14, 15};
  Expect e = uniform("q4_k", "q4_k", "q6_k", n);
  e.v = at(more, "q6_k", "q4_k", n);
  e.down = at(more, "q6_k", "q4_k", n);
  check("q4_k_m", types_of("q4_k_m", m, tensors), e, n);
  e = uniform("q5_k", "q5_k", "q6_k", n);
  e.v = at(more, "q6_k", "q5_k", n);
  e.down = at(more, "q6_k", "q5_k", n);
  check("q5_k_m", types_of("q5_k_m", m, tensors), e, n);
  e = uniform("q4_k", "q4_k", "q6_k", n);
  e.v = at({0, 1, 2, 3}, "q5_k", "q4_k", n);  // the first four attn_v
  e.down = at({0, 1}, "q5_k", "q4_k", n);     // the first eighth of ffn_down
  check("q4_k_s", types_of("q4_k_s", m, tensors), e, n);
  check("q5_k_s", types_of("q5_k_s", m, tensors), uniform("q5_k", "q5_k", "q6_k", n), n);
  check("q6_k", types_of("q6_k", m, tensors), uniform("q6_k", "q6_k", "q6_k", n), n);
  e = uniform("q3_k", "q3_k", "q6_k", n);
  e.o = "q4_k";
  e.v = at({0, 1}, "q5_k", "q4_k", n);
  e.down = at({0}, "q5_k", "q4_k", n);  // the first sixteenth
  check("q3_k_m", types_of("q3_k_m", m, tensors), e, n);
  e = uniform("q2_k", "q2_k", "q6_k", n);
  e.o = "q3_k";
  e.v = at({}, "q4_k", "q4_k", n);  // n_gqa >= 4
  e.down = at({}, "q3_k", "q3_k", n);
  check("q2_k", types_of("q2_k", m, tensors), e, n);
  for (const char* t : {"q4_0", "q4_1", "q5_0", "q5_1"})
    check(t, types_of(t, m, tensors), uniform(t, t, "q6_k", n), n);
  check("q8_0", types_of("q8_0", m, tensors), uniform("q8_0", "q8_0", "q8_0", n), n);

  // Fewer key-value heads than 4 per group: Q2_K's attn_v is Q3_K.
  e = uniform("q2_k", "q2_k", "q6_k", n);
  e.o = "q3_k";
  e.v = at({}, "q3_k", "q3_k", n);
  e.down = at({}, "q3_k", "q3_k", n);
  check("q2_k gqa 2", types_of("q2_k", {n, 2, false}, tensors), e, n);
  // What llama.cpp sizes as 70B: attn_v of Q3_K/Q4_K becomes Q5_K.
  e = uniform("q4_k", "q4_k", "q6_k", n);
  e.v = at(more, "q6_k", "q5_k", n);
  e.down = at(more, "q6_k", "q4_k", n);
  check("q4_k_m 70b", types_of("q4_k_m", {n, 4, true}, tensors), e, n);
}

TEST(QuantRecipe, RowsOf576FallBack) {
  // SmolLM2-135M's widths (576, 9 heads over 3, MLP 1536), 8 layers, tied: only
  // ffn_down's rows (1536) are whole blocks of 256.
  const int n = 8;
  const auto tensors = llama_tensors(n, 576, 192, 1536, 1000, true);
  const models::RecipeModel m{n, 3, false};
  const std::set<int> more = {0, 3, 6, 7};  // use_more_bits of 8 layers
  // The tied embedding is the head: its rows are not whole Q4_K blocks -> Q8_0.
  Expect e = uniform("q5_0", "q8_0", "", n);  // Q4_K -> Q5_0
  e.v = at(more, "q8_0", "q5_0", n);          // Q6_K -> Q8_0
  e.down = at(more, "q6_k", "q4_k", n);
  check("q4_k_m", types_of("q4_k_m", m, tensors), e, n);
  e = uniform("q5_1", "q8_0", "", n);  // Q5_K -> Q5_1
  e.v = at(more, "q8_0", "q5_1", n);
  e.down = at(more, "q6_k", "q5_k", n);
  check("q5_k_m", types_of("q5_k_m", m, tensors), e, n);
  e = uniform("q5_0", "q8_0", "", n);
  e.v = at({0, 1, 2, 3}, "q5_1", "q5_0", n);
  e.down = at({0}, "q5_k", "q4_k", n);
  check("q4_k_s", types_of("q4_k_s", m, tensors), e, n);
  e = uniform("q5_1", "q8_0", "", n);
  e.down = at({}, "q5_k", "q5_k", n);
  check("q5_k_s", types_of("q5_k_s", m, tensors), e, n);
  e = uniform("q8_0", "q8_0", "", n);
  e.down = at({}, "q6_k", "q6_k", n);
  check("q6_k", types_of("q6_k", m, tensors), e, n);
  e = uniform("q4_0", "q8_0", "", n);  // Q3_K -> Q4_0
  e.o = "q5_0";
  e.v = at({0, 1}, "q5_1", "q5_0", n);
  e.down = at({}, "q4_k", "q4_k", n);  // 8 / 16 = 0 layers of Q5_K
  check("q3_k_m", types_of("q3_k_m", m, tensors), e, n);
  e = uniform("q4_0", "q8_0", "", n);  // Q2_K -> Q4_0
  e.v = at({}, "q4_0", "q4_0", n);     // Q3_K (n_gqa 3) -> Q4_0
  e.down = at({}, "q3_k", "q3_k", n);
  check("q2_k", types_of("q2_k", m, tensors), e, n);
  // 32-value types: the head is Q6_K, whose fallback is Q8_0.
  for (const char* t : {"q4_0", "q4_1", "q5_0", "q5_1", "q8_0"})
    check(t, types_of(t, m, tensors), uniform(t, "q8_0", "", n), n);
}

TEST(QuantRecipe, RowsNotWholeBlocksOf32AreF16) {
  // Width 64, MLP 48: ffn_down's rows of 48 fit no block type.
  const int n = 2;
  const auto tensors = llama_tensors(n, 64, 64, 48, 100, false);
  for (const std::string& r : models::quant_recipe_names()) {
    const auto got = types_of(r, {n, 1, false}, tensors);
    EXPECT_EQ(got.at("blk.0.ffn_down.weight"), "f16") << r;
    EXPECT_EQ(got.at("blk.1.ffn_down.weight"), "f16") << r;
    // A head of 64-value rows: Q8_0 for every recipe (rows not whole blocks of
    // 256, or Q6_K's fallback).
    EXPECT_EQ(got.at("output.weight"), "q8_0") << r;
  }
}

TEST(QuantRecipe, UnknownRecipeIsAnError) {
  EXPECT_FALSE(models::is_quant_recipe("q4_k"));  // a block type, not a recipe
  EXPECT_TRUE(models::is_quant_recipe("q4_k_m"));
  EXPECT_EQ(models::quant_recipe_file_type("q4_k_m"), 15u);  // LLAMA_FTYPE_MOSTLY_Q4_K_M
  try {
    models::quant_recipe_types("q4_k_l", {1, 1, false}, {});
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown quantization recipe 'q4_k_l'"), std::string::npos)
        << e.what();
  }
}

TEST(QuantRecipe, Gpt2TensorsOfAModel) {
  // GPT-2: the fused attn_qkv is treated as attn_v; position_embd and biases stay
  // f32; the file has no output.weight, so the embedding is the head (Q6_K).
  Context ctx;
  models::Gpt2Config c;
  c.vocab_size = 300;
  c.n_positions = 16;
  c.n_embd = 256;
  c.n_layer = 8;
  c.n_head = 4;
  models::ModelConfig cfg;
  cfg.model_type = "gpt2";
  cfg.gpt2 = c;
  auto model = models::make_model(ctx, cfg);
  std::map<std::string, std::string> got;
  for (const auto& [name, t] : models::quant_recipe_types("q4_k_m", *model))
    got[name] = dtype_name(t);
  EXPECT_EQ(got.count("output.weight"), 0u);
  EXPECT_EQ(got.at("token_embd.weight"), "q6_k");
  EXPECT_EQ(got.at("position_embd.weight"), "f32");
  EXPECT_EQ(got.at("blk.0.attn_qkv.bias"), "f32");
  const std::set<int> more = {0, 3, 6, 7};
  for (int l = 0; l < 8; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const std::string hi = more.count(l) ? "q6_k" : "q4_k";
    EXPECT_EQ(got.at(p + "attn_qkv.weight"), hi) << p;
    EXPECT_EQ(got.at(p + "ffn_down.weight"), hi) << p;
    EXPECT_EQ(got.at(p + "attn_output.weight"), "q4_k") << p;
    EXPECT_EQ(got.at(p + "ffn_up.weight"), "q4_k") << p;
  }
}

TEST(QuantRecipe, SavedFileHasTheTypesAndLoadsAsStored) {
  // A small Llama (2 layers, rows of 256 and 512, untied) saved with Q4_K_M:
  // the file's types are quant_recipe_types', and kiln keeps them as stored.
  models::LlamaConfig c;
  c.vocab_size = 64;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 4;
  c.num_key_value_heads = 2;
  c.head_dim = 64;
  c.max_position_embeddings = 32;
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  cfg.llama = c;
  CpuBackend cpu(2);
  kiln_test::TempDir tmp;
  const std::string path = tmp.file("q4_k_m.gguf");
  std::vector<std::pair<std::string, DType>> want;
  {
    Context ctx;
    auto model = models::make_model(ctx, cfg);
    model->allocate(cpu);
    model->init(3);
    models::save_gguf(*model, path, nullptr, "q4_k_m");
    want = models::quant_recipe_types("q4_k_m", *model);
  }
  const GgufFile f(path);
  EXPECT_EQ(f.find("general.file_type")->as_int(), 15);
  std::map<std::string, DType> in_file;
  for (const GgufTensorInfo& t : f.tensors()) in_file[t.name] = t.dtype;
  for (const auto& [name, t] : want) EXPECT_EQ(dtype_name(in_file.at(name)), dtype_name(t)) << name;
  // Of 2 layers use_more_bits picks the last (7 * 2 / 8 = 1) alone.
  EXPECT_EQ(in_file.at("blk.0.attn_v.weight"), q4_k);
  EXPECT_EQ(in_file.at("blk.1.attn_v.weight"), q6_k);
  EXPECT_EQ(in_file.at("blk.0.ffn_down.weight"), q4_k);
  EXPECT_EQ(in_file.at("blk.1.ffn_down.weight"), q6_k);
  EXPECT_EQ(in_file.at("blk.0.attn_q.weight"), q4_k);
  EXPECT_EQ(in_file.at("output.weight"), q6_k);
  Context ctx;
  models::ModelOptions o;
  o.weight_dtype = models::ModelOptions::WeightDType::stored;
  auto loaded = models::load_gguf(ctx, cpu, path, o);
  EXPECT_EQ(loaded->parameter("model.layers.1.self_attn.v_proj.weight").dtype(), q6_k);
  EXPECT_EQ(loaded->parameter("model.layers.0.self_attn.q_proj.weight").dtype(), q4_k);
  EXPECT_EQ(loaded->parameter("lm_head.weight").dtype(), q6_k);
  EXPECT_EQ(loaded->parameter("model.embed_tokens.weight").dtype(), q4_k);
}

}  // namespace
}  // namespace kiln::test
