// Module trees: hierarchical names and their order, lookups, errors, moves,
// weight tying (one summed gradient), default inits and their statistics.
#include <algorithm>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

struct TinyGpt : nn::Module {
  nn::Embedding& wte;
  nn::Sequential& blocks;
  nn::LayerNorm& ln_f;
  nn::Linear& lm_head;
  TinyGpt(Context& ctx, int64_t vocab, int64_t dim, int n_layer)
      : Module(ctx),
        wte(add<nn::Embedding>("wte", vocab, dim)),
        blocks(add<nn::Sequential>("blocks")),
        ln_f(add<nn::LayerNorm>("ln_f", dim)),
        lm_head(add<nn::Linear>("lm_head", dim, vocab, false)) {
    for (int i = 0; i < n_layer; ++i) blocks.push_back<nn::TransformerBlock>(dim, 2);
    lm_head.tie("weight", wte.weight());
  }
  Tensor forward(Tensor idx) override { return lm_head(ln_f(blocks(wte(idx)))); }
};

std::vector<std::string> names_of(const nn::Module& m) {
  std::vector<std::string> n;
  for (auto& [name, t] : m.named_parameters()) n.push_back(name);
  return n;
}

// A param's dtype changes before allocation, everywhere it is used: the tied
// head follows the embedding, names and order stay, and the forward pass reads
// the bf16 matrices (matmul and embedding take them).
TEST(NnModule, SetParameterDtypeKeepsTiesAndNames) {
  Context ctx;
  TinyGpt gpt(ctx, 11, 8, 1);
  const std::vector<std::string> names = names_of(gpt);
  Tensor old = gpt.wte.weight();
  Tensor now = gpt.set_parameter_dtype("wte.weight", bf16);
  EXPECT_NE(now.node(), old.node());
  EXPECT_EQ(now.dtype(), bf16);
  EXPECT_EQ(now.name(), "wte.weight");
  EXPECT_TRUE(now.has_flag(kFlagParam));
  EXPECT_EQ(gpt.wte.weight().node(), now.node());
  EXPECT_EQ(gpt.lm_head.weight().node(), now.node());  // still tied
  EXPECT_EQ(names_of(gpt), names);
  gpt.set_parameter_dtype("blocks.0.mlp.c_fc.weight", f16);
  EXPECT_EQ(gpt.parameter("blocks.0.mlp.c_fc.weight").dtype(), f16);
  CpuBackend cpu(1);
  gpt.allocate(cpu);
  EXPECT_TRUE(now.has_data());
  EXPECT_TRUE(kiln_test::is_error(
      kiln_test::error_message([&] { gpt.set_parameter_dtype("ln_f.weight", bf16); }), "nn",
      {"ln_f.weight", "already has memory"}));
  Tensor idx = ctx.input(i32, {1, 3});
  Tensor logits = gpt(idx);
  EXPECT_EQ(logits.dtype(), f32);
  Graph g = Graph::forward(logits);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  idx.set(std::vector<int32_t>{1, 4, 9});
  cpu.compute(g);
  for (float v : logits.get<float>()) EXPECT_EQ(v, 0.0f);  // zero-filled params
}

TEST(NnModule, HierarchicalNamesInRegistrationOrder) {
  Context ctx;
  TinyGpt gpt(ctx, 11, 8, 2);
  std::vector<std::string> want = {"wte.weight"};
  for (std::string b : {"blocks.0.", "blocks.1."})
    for (const char* p :
         {"ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias",
          "attn.c_proj.weight", "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight",
          "mlp.c_fc.bias", "mlp.c_proj.weight", "mlp.c_proj.bias"})
      want.push_back(b + p);
  want.push_back("ln_f.weight");
  want.push_back("ln_f.bias");  // lm_head.weight is wte.weight: listed once
  EXPECT_EQ(names_of(gpt), want);
  // Tensor names are the hierarchical ones (checkpoints save by tensor name).
  for (auto& [name, t] : gpt.named_parameters()) EXPECT_EQ(t.name(), name);
  EXPECT_EQ(gpt.parameters().size(), want.size());
  EXPECT_EQ(gpt.parameter("blocks.1.attn.c_proj.bias"),
            gpt.blocks[1].child("attn.c_proj").parameter("bias"));
  EXPECT_EQ(gpt.parameter("lm_head.weight"), gpt.wte.weight());
  EXPECT_EQ(gpt.parameter("blocks.0.mlp.c_fc.weight").shape(), Shape({32, 8}));
  EXPECT_EQ(gpt.blocks[0].path(), "blocks.0");
  // A sub-tree lists names relative to itself.
  EXPECT_EQ(
      names_of(gpt.blocks[1].child("attn")),
      (std::vector<std::string>{"c_attn.weight", "c_attn.bias", "c_proj.weight", "c_proj.bias"}));
}

TEST(NnModule, MovingKeepsTheTreeAndNames) {
  Context ctx;
  TinyGpt a(ctx, 7, 4, 1);
  const auto before = a.named_parameters();
  TinyGpt b(std::move(a));
  EXPECT_EQ(b.named_parameters(), before);
  EXPECT_EQ(b.blocks[0].child("attn").path(), "blocks.0.attn");
  static_assert(!std::is_copy_constructible_v<TinyGpt>);
  static_assert(!std::is_copy_assignable_v<nn::Linear>);
}

struct Dup : nn::Module {
  explicit Dup(Context& ctx) : Module(ctx) {
    add<nn::Linear>("fc", 2, 2);
    add<nn::Linear>("fc", 2, 2);
  }
};
struct BadName : nn::Module {
  explicit BadName(Context& ctx) : Module(ctx) { add<nn::Linear>("a.b", 2, 2); }
};

TEST(NnModule, ClearErrors) {
  Context ctx;
  EXPECT_NE(
      kiln_test::error_message([&] { Dup d(ctx); }).find("already has a sub-module called 'fc'"),
      std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              BadName d(ctx);
            }).find("name 'a.b' must be non-empty and contain no '.'"),
            std::string::npos);
  TinyGpt gpt(ctx, 5, 4, 1);
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.parameter("blocks.3.ln_1.weight");
            }).find("has no sub-module '3'"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.parameter("ln_f.scale");
            }).find("LayerNorm 'ln_f' has no param 'scale'"),
            std::string::npos);
  Tensor idx = ctx.input(i32, {1, 3});
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.blocks.child("0").child("attn")(ctx.input(f32, {1, 3, 5}));
            }).find("CausalSelfAttention 'blocks.0.attn' expects [B, T, 4] but got [1, 3, 5]"),
            std::string::npos);
  nn::Sequential holder(ctx);
  nn::Module plain(ctx);
  EXPECT_NE(kiln_test::error_message([&] { plain(idx); }).find("has no one-tensor forward"),
            std::string::npos);
  nn::Linear other(ctx, 3, 5);
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.lm_head.tie("weight", other.weight());
            }).find("is f32 [5, 3] but the param is f32 [5, 4]"),
            std::string::npos);
  Context ctx2;
  nn::Linear foreign(ctx2, 4, 5);
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.lm_head.tie("weight", foreign.weight());
            }).find("another Context"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              nn::Linear l(ctx, 0, 3);
            }).find("in_features must be positive"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              gpt.init(1);
            }).find("has no memory: call allocate(backend) first"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              nn::CausalSelfAttention a(ctx, 10, 3);
            }).find("multiple of n_head 3"),
            std::string::npos);
}

TEST(NnModule, TiedEmbeddingAndHeadGetOneSummedGradient) {
  Context ctx;
  struct TiedLm : nn::Module {
    nn::Embedding& wte;
    nn::Linear& lm_head;
    explicit TiedLm(Context& c)
        : Module(c),
          wte(add<nn::Embedding>("wte", 5, 4)),
          lm_head(add<nn::Linear>("lm_head", 4, 5, false)) {
      lm_head.tie("weight", wte.weight());
    }
    Tensor forward(Tensor idx) override { return lm_head(wte(idx)); }
  } lm(ctx);
  ASSERT_EQ(names_of(lm), std::vector<std::string>{"wte.weight"});
  Tensor idx = ctx.input(i32, {3}, "idx");
  Tensor y = lm(idx);  // [3, 5]: y[n, v] = sum_d W[idx_n, d] W[v, d]
  const std::vector<int32_t> ids = {4, 1, 4};
  check_layer(
      ctx, y, {lm.wte.weight()}, {},
      [&](const std::vector<Values>& v) {
        Values out;
        for (int32_t id : ids)
          for (int r = 0; r < 5; ++r) {
            double s = 0;
            for (int d = 0; d < 4; ++d) s += v[0][size_t(id * 4 + d)] * v[0][size_t(r * 4 + d)];
            out.push_back(s);
          }
        return out;
      },
      1e-5, 1e-4,
      [&] {
        idx.set(ids);
        lm.init(9);
      });
}

struct Stats {
  double mean = 0, sd = 0, lo = 1e300, hi = -1e300;
};
Stats stats_of(Tensor t) {
  const std::vector<float> v = t.get<float>();
  Stats s;
  for (float x : v) {
    s.mean += x;
    s.lo = std::min(s.lo, double(x));
    s.hi = std::max(s.hi, double(x));
  }
  s.mean /= double(v.size());
  for (float x : v) s.sd += (x - s.mean) * (x - s.mean);
  s.sd = std::sqrt(s.sd / double(v.size()));
  return s;
}

// U(-b, b): mean 0 (+- a few standard errors), sd b/sqrt(3), bounds inside and near b.
void expect_uniform(Tensor t, double b) {
  const Stats s = stats_of(t);
  const double n = double(t.numel()), sd = b / std::sqrt(3.0);
  EXPECT_NEAR(s.mean, 0.0, 5 * sd / std::sqrt(n)) << t.name();
  // The sample sd of a uniform has a relative standard error of sqrt(0.2 / n).
  EXPECT_NEAR(s.sd, sd, 4 * std::sqrt(0.2 / n) * sd) << t.name();
  EXPECT_GE(s.lo, -b) << t.name();
  EXPECT_LE(s.hi, b) << t.name();
  // The extremes come within b * 20/n of the bounds (fails with odds e^-40).
  EXPECT_GT(s.hi, (1 - 40 / n) * b) << t.name();
  EXPECT_LT(s.lo, -(1 - 40 / n) * b) << t.name();
}

TEST(NnModule, DefaultInitsMatchPyTorchStatistics) {
  Context ctx;
  nn::Sequential m(ctx);
  auto& lin = m.push_back<nn::Linear>(400, 300);
  auto& conv = m.push_back<nn::Conv2d>(8, 64, 3);
  auto& emb = m.push_back<nn::Embedding>(500, 64);
  auto& ln = m.push_back<nn::LayerNorm>(32);
  auto& rms = m.push_back<nn::RMSNorm>(32);
  CpuBackend cpu(1);
  m.allocate(cpu);
  m.init(123);
  expect_uniform(lin.weight(), 1.0 / std::sqrt(400.0));
  expect_uniform(lin.bias(), 1.0 / std::sqrt(400.0));
  expect_uniform(conv.weight(), 1.0 / std::sqrt(72.0));
  expect_uniform(conv.bias(), 1.0 / std::sqrt(72.0));
  const Stats e = stats_of(emb.weight());
  EXPECT_NEAR(e.mean, 0.0, 5.0 / std::sqrt(32000.0));
  EXPECT_NEAR(e.sd, 1.0, 0.02);
  for (float v : ln.weight().get<float>()) EXPECT_EQ(v, 1.0f);
  for (float v : ln.bias().get<float>()) EXPECT_EQ(v, 0.0f);
  for (float v : rms.weight().get<float>()) EXPECT_EQ(v, 1.0f);
}

TEST(NnModule, InitIsSeededAndDependsOnThePathNotTheOrder) {
  struct Two : nn::Module {
    Two(Context& c, bool swap) : Module(c) {
      if (swap) {
        add<nn::Linear>("b", 3, 3);
        add<nn::Linear>("a", 3, 3);
      } else {
        add<nn::Linear>("a", 3, 3);
        add<nn::Linear>("b", 3, 3);
      }
    }
  };
  Context ctx;
  CpuBackend cpu(1);
  Two x(ctx, false), y(ctx, true), z(ctx, false);
  for (nn::Module* m : {(nn::Module*)&x, (nn::Module*)&y, (nn::Module*)&z}) m->allocate(cpu);
  x.init(5);
  y.init(5);
  z.init(6);
  EXPECT_EQ(x.parameter("a.weight").get<float>(), y.parameter("a.weight").get<float>());
  EXPECT_EQ(x.parameter("b.bias").get<float>(), y.parameter("b.bias").get<float>());
  EXPECT_NE(x.parameter("a.weight").get<float>(), z.parameter("a.weight").get<float>());
  EXPECT_NE(x.parameter("a.weight").get<float>(), x.parameter("b.weight").get<float>());
}

TEST(NnModule, AllocateGivesOneBufferAndKeepsExistingMemory) {
  Context ctx;
  CpuBackend cpu(1);
  nn::Linear a(ctx, 3, 4);
  a.allocate(cpu);
  a.init(1);
  const std::vector<float> w = a.weight().get<float>();
  const void* where = a.weight().node()->data;
  a.allocate(cpu);  // nothing new: nothing moves
  EXPECT_EQ(a.weight().node()->data, where);
  EXPECT_EQ(a.weight().get<float>(), w);
}

}  // namespace
}  // namespace kiln::test
