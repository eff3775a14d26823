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
