// The models' RoPE (detail::apply_rope on the fused ROPE op) with tables
// narrowed at a position offset, as a KV cache rotates new tokens: the rotation
// by the angles of positions offset .. offset+T-1 (llama3 frequency scaling
// included), and, token by token, bit for bit what one pass over the whole
// sequence gives; and the Llama graph uses the fused RMS_NORM and ROPE.
#include <cmath>
#include <map>
#include <vector>

#include "models/rope.h"
#include "models_test_util.h"

namespace kiln::test {
namespace {

models::LlamaConfig rope_config() {
  models::LlamaConfig c;
  c.head_dim = 8;
  c.rope_theta = 10000.0;
  c.rope_scaling = models::RopeScaling{8.0, 1.0, 4.0, 16};  // bends some frequencies
  return c;
}

struct RopeRig {
  static constexpr int64_t S = 12, H = 2, D = 8;
  Context ctx;
  CpuBackend cpu{2};
  Tensor cos = ctx.input(f32, {S, D}, "cos"), sin = ctx.input(f32, {S, D}, "sin");
  std::unique_ptr<Buffer> buf;

  // Rotates x [1, T, H, D] with the tables narrowed at `offset`.
  std::vector<float> rotate(const std::vector<float>& xv, int64_t T, int64_t offset) {
    Tensor x = ctx.input(f32, {1, T, H, D});
    Tensor y = models::detail::apply_rope(x, cos.narrow(0, offset, T), sin.narrow(0, offset, T));
    Graph g = Graph::forward(y);
    GraphAllocator galloc(cpu.buffer_type());
    galloc.alloc(g);
    x.set(xv);
    cpu.compute(g);
    return y.get<float>();
  }
  RopeRig() {
    buf = allocate_tensors(ctx, cpu);
    std::vector<float> c, s;
    models::detail::rope_tables(rope_config(), S, c, s);
    cos.set(c);
    sin.set(s);
  }
};

std::vector<float> values(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = float(std::sin(0.37 * double(i) + 0.1));
  return v;
}

TEST(ModelRope, TablesNarrowedAtAnOffsetRotateThosePositions) {
  RopeRig r;
  const int64_t T = 3, offset = 7, D = RopeRig::D, H = RopeRig::H, h = D / 2;
  const std::vector<float> x = values(T * H * D);
  const std::vector<float> y = r.rotate(x, T, offset);
  const std::vector<double> inv = models::detail::rope_inv_freq(rope_config());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t hh = 0; hh < H; ++hh)
      for (int64_t i = 0; i < h; ++i) {
        const double a = double(offset + t) * inv[size_t(i)];
        const size_t k = size_t((t * H + hh) * D + i);
        const double lo = x[k], hi = x[k + size_t(h)];
        EXPECT_NEAR(y[k], lo * std::cos(a) - hi * std::sin(a), 1e-6) << t << " " << i;
        EXPECT_NEAR(y[k + size_t(h)], hi * std::cos(a) + lo * std::sin(a), 1e-6) << t << " " << i;
      }
}

TEST(ModelRope, TokenByTokenEqualsTheWholeSequence) {
  RopeRig r;
  const int64_t T = RopeRig::S, n = RopeRig::H * RopeRig::D;
  const std::vector<float> x = values(T * n);
  const std::vector<float> whole = r.rotate(x, T, 0);
  for (int64_t p = 0; p < T; ++p) {
    const std::vector<float> xp(x.begin() + p * n, x.begin() + (p + 1) * n);
    const std::vector<float> yp = r.rotate(xp, 1, p);
    for (int64_t k = 0; k < n; ++k) ASSERT_EQ(yp[size_t(k)], whole[size_t(p * n + k)]) << p;
  }
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

// The Llama model's graph goes through the fused primitives: two RMS_NORMs per
// layer and the final norm, one ROPE each for q and k, and none of the
// composites' nodes (no CONCAT from rotate_half, no SQRT from the norm).
TEST(ModelRope, LlamaGraphUsesTheFusedOps) {
  models::ModelConfig cfg;
  cfg.model_type = "llama";
  models::LlamaConfig c;
  c.vocab_size = 11;
  c.hidden_size = 16;
  c.intermediate_size = 24;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 8;
  cfg.llama = c;
  Context ctx;
  CpuBackend cpu(1);
  auto model = models::make_llama(ctx, cfg, {.max_seq_len = 8});
  model->allocate(cpu);
  Tensor logits = (*model)(ctx.input(i32, {1, 5}, "ids"));
  std::map<Op, int> n;
  const Graph g = Graph::forward(logits);
  for (const TensorNode* node : g.nodes()) ++n[node->op];
  EXPECT_EQ(n[Op::RMS_NORM], 2 * 2 + 1);
  EXPECT_EQ(n[Op::ROPE], 2 * 2);
  EXPECT_EQ(n[Op::CONCAT], 0);
  EXPECT_EQ(n[Op::SQRT], 0);
}

}  // namespace
}  // namespace kiln::test

#include <fstream>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "models/json_fields.h"

namespace kiln::test {
namespace {

std::string read_file_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Every scaling type (linear, dynamic at and beyond max_position_embeddings,
// yarn in both config forms with its optional fields, longrope's short and long
// factors, llama3): the inverse frequencies, attention factor and cos/sin
// tables kiln computes from the config equal the PyTorch reference's
// (tests/models/make_rope_fixtures.py) within 1e-6 relative; and config_json
// writes each back so that it reads the same.
TEST(ModelRope, ScalingTypesMatchTheReference) {
  const std::string dir = fixture_dir("rope_scaling");
  const models::detail::Json cases =
      models::detail::parse_json_object(read_file_text(dir + "/cases.json"), "cases.json");
  Expected e("rope_scaling");
  EXPECT_EQ(cases.size(), size_t(9));
  for (auto it = cases.begin(); it != cases.end(); ++it) {
    const std::string name = it.key();
    const models::ModelConfig cfg = models::parse_config(it.value().dump(), name);
    const models::LlamaConfig& c = *cfg.llama;
    const int64_t S = e.ints(name + ".positions")[0];
    const std::vector<double> inv = models::detail::rope_inv_freq(c, S);
    const std::vector<float> want = e.floats(name + ".inv_freq");
    ASSERT_EQ(inv.size(), want.size()) << name;
    for (size_t i = 0; i < inv.size(); ++i)
      EXPECT_NEAR(inv[i], want[i], 1e-6 * std::fabs(want[i])) << name << " " << i;
    const double att = e.floats(name + ".attention_factor")[0];
    EXPECT_NEAR(models::detail::rope_attention_factor(c), att, 1e-6 * att) << name;
    std::vector<float> cos, sin;
    models::detail::rope_tables(c, S, cos, sin);
    EXPECT_LT(rel_error(cos, e.floats(name + ".cos")), 1e-6) << name;
    EXPECT_LT(rel_error(sin, e.floats(name + ".sin")), 1e-6) << name;
    const models::ModelConfig back = models::parse_config(models::config_json(cfg), name);
    EXPECT_EQ(models::detail::rope_inv_freq(*back.llama, S), inv) << name;
    EXPECT_EQ(models::detail::rope_attention_factor(*back.llama),
              models::detail::rope_attention_factor(c))
        << name;
  }
}

std::string llama_config_with(const std::string& rope) {
  return R"({"model_type": "llama", "vocab_size": 8, "hidden_size": 16,
    "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
    "max_position_embeddings": 64, )" +
         rope + "}";
}

TEST(ModelRope, ScalingConfigErrors) {
  auto parse = [](const std::string& rope) {
    return kiln_test::error_message(
        [&] { models::parse_config(llama_config_with(rope), "c.json"); });
  };
  EXPECT_TRUE(kiln_test::is_error(parse(R"("rope_scaling": {"rope_type": "su", "factor": 2})"),
                                  "models", {"c.json", "rope_scaling", "'su'", "yarn"}));
  EXPECT_TRUE(kiln_test::is_error(parse(R"("rope_parameters": {"rope_type": "ntk", "factor": 2})"),
                                  "models", {"c.json", "rope_parameters", "'ntk'"}));
  EXPECT_TRUE(kiln_test::is_error(parse(R"("rope_scaling": {"rope_type": "linear"})"), "models",
                                  {"c.json", "factor"}));
  // A field another type uses is not silently dropped.
  EXPECT_TRUE(kiln_test::is_error(
      parse(R"("rope_scaling": {"rope_type": "linear", "factor": 2, "beta_fast": 4})"), "models",
      {"c.json", "beta_fast"}));
  EXPECT_TRUE(kiln_test::is_error(
      parse(R"("rope_scaling": {"rope_type": "yarn", "type": "linear", "factor": 2})"), "models",
      {"c.json", "'type'", "linear", "yarn"}));
  EXPECT_TRUE(kiln_test::is_error(
      parse(R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})"),
      "models", {"c.json", "partial_rotary_factor"}));
  EXPECT_TRUE(
      kiln_test::is_error(parse(R"("rope_scaling": {"rope_type": "longrope", "short_factor": [1, 1],
                                "long_factor": [1, 1, 1, 1]})"),
                          "models", {"c.json", "short_factor", "4 numbers"}));
  EXPECT_TRUE(kiln_test::is_error(parse(R"("rope_scaling": {"rope_type": "linear", "factor": 2},
               "rope_parameters": {"rope_type": "linear", "factor": 3})"),
                                  "models", {"c.json", "rope_parameters", "rope_scaling"}));
  // rope_parameters "default" with its theta: plain RoPE at that theta.
  const models::ModelConfig d = models::parse_config(
      llama_config_with(R"("rope_parameters": {"rope_type": "default", "rope_theta": 500.0})"));
  EXPECT_FALSE(d.llama->rope_scaling);
  EXPECT_EQ(d.llama->rope_theta, 500.0);
}

// GGUF: linear and yarn as llama.cpp's rope.scaling.* keys, read back to the
// same frequencies; dynamic and longrope have no GGUF form and are refused by name.
TEST(ModelRope, GgufScalingKeys) {
  kiln_test::TempDir tmp;
  using RT = models::RopeScaling::Type;
  for (RT type : {RT::linear, RT::yarn, RT::dynamic, RT::longrope}) {
    models::ModelConfig cfg;
    cfg.model_type = "llama";
    models::LlamaConfig c;
    c.vocab_size = 8;
    c.hidden_size = 16;
    c.intermediate_size = 8;
    c.num_hidden_layers = 1;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 2;
    c.head_dim = 8;
    c.max_position_embeddings = 256;
    models::RopeScaling r;
    r.type = type;
    r.factor = 4.0;
    r.original_max_position_embeddings = 64;
    r.beta_fast = 16;
    r.short_factor = r.long_factor = {1, 2, 3, 4};
    c.rope_scaling = r;
    cfg.llama = c;
    Context ctx;
    CpuBackend cpu(1);
    auto model = models::make_model(ctx, cfg, {.max_seq_len = 8});
    model->allocate(cpu);
    const std::string path = tmp.file(std::string(models::rope_scaling_name(type)) + ".gguf");
    if (type == RT::dynamic || type == RT::longrope) {
      EXPECT_KILN_ERROR(models::save_gguf(*model, path), "models", models::rope_scaling_name(type),
                        "no GGUF form");
      continue;
    }
    models::save_gguf(*model, path);
    GgufFile f(path);
    EXPECT_EQ(f.get("llama.rope.scaling.type").as_string(), models::rope_scaling_name(type));
    const models::ModelConfig back = models::read_gguf_config(path);
    ASSERT_TRUE(back.llama->rope_scaling);
    EXPECT_EQ(back.llama->rope_scaling->type, type);
    const std::vector<double> want = models::detail::rope_inv_freq(c, 8),
                              got = models::detail::rope_inv_freq(*back.llama, 8);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-12 * want[i]);
    EXPECT_EQ(models::detail::rope_attention_factor(*back.llama),
              models::detail::rope_attention_factor(c));
  }
}

}  // namespace
}  // namespace kiln::test
