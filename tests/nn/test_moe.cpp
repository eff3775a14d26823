// kiln::nn::MoeFeedForward and moe_route against the PyTorch reference
// (tests/nn/make_moe_fixture.py: a float64 Mixtral / Qwen3-MoE block): the
// chosen experts, the output and a training step's gradients for the input,
// the router and the three stacked expert weights, with norm_topk_prob on and
// off. Unchosen experts get a zero gradient.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/safetensors_fixture.h"
#include "kiln/kiln.h"
#include "kiln/nn/moe.h"

namespace kiln::test {
namespace {

class MoeFixture : public kiln_test::SafetensorsFixture {
 public:
  MoeFixture()
      : SafetensorsFixture(std::string(KILN_SOURCE_DIR) +
                           "/tests/nn/fixtures/moe/expected.safetensors") {}
};

using kiln_test::rel_error;

void check_variant(const std::string& v, bool norm) {
  MoeFixture fx;
  const std::vector<int64_t> xd = fx.dims(v + "x"), ed = fx.dims(v + "gate_exps");
  const int64_t N = xd[0], H = xd[1], E = ed[0], I = ed[1];
  const int64_t K = fx.dims(v + "ids")[1];
  Context ctx;
  nn::MoeFeedForward moe(ctx, {H, I, E, K, norm});
  Tensor x = ctx.param(f32, {N, H}, "x");
  Tensor cot = ctx.input(f32, {N, H}, "cot");
  const nn::MoeRouting route = nn::moe_route(moe.gate(x), K, norm);
  Tensor y = moe(x);
  Tensor loss = sum(y * cot);
  Graph g = Graph::forward({loss, y, route.ids});
  g.backward(loss);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  x.set(fx.floats(v + "x"));
  cot.set(fx.floats(v + "cot"));
  moe.gate.weight().set(fx.floats(v + "gate"));
  moe.gate_exps().set(fx.floats(v + "gate_exps"));
  moe.up_exps().set(fx.floats(v + "up_exps"));
  moe.down_exps().set(fx.floats(v + "down_exps"));
  cpu.compute(g);

  EXPECT_EQ(route.ids.get<int32_t>(), fx.ints(v + "ids")) << v;
  EXPECT_LT(rel_error(y.get<float>(), fx.floats(v + "y")), 1e-5) << v;
  const std::pair<const char*, Tensor> leaves[] = {{"x", x},
                                                   {"gate", moe.gate.weight()},
                                                   {"gate_exps", moe.gate_exps()},
                                                   {"up_exps", moe.up_exps()},
                                                   {"down_exps", moe.down_exps()}};
  for (const auto& [name, t] : leaves) {
    Tensor gt = g.grad(t);
    ASSERT_TRUE(gt.defined()) << v << name;
    EXPECT_LT(rel_error(gt.get<float>(), fx.floats(v + "grad." + name)), 1e-4) << v << name;
  }
  // Experts no token chose: exactly zero gradient.
  std::vector<bool> chosen(size_t(E), false);
  for (int32_t e : fx.ints(v + "ids")) chosen[size_t(e)] = true;
  const std::vector<float> gd = g.grad(moe.down_exps()).get<float>();
  for (int64_t e = 0; e < E; ++e)
    if (!chosen[size_t(e)])
      for (int64_t i = 0; i < H * I; ++i) ASSERT_EQ(gd[size_t(e * H * I + i)], 0.0f) << v << e;
}

TEST(NnMoe, MatchesTheReferenceWithNormalisedTopK) { check_variant("norm.", true); }
TEST(NnMoe, MatchesTheReferenceWithRawTopK) { check_variant("raw.", false); }

// [B, T, H] inputs route each token independently: the same rows as [B*T, H].
TEST(NnMoe, LeadingDimsAreTokens) {
  Context ctx;
  nn::MoeFeedForward moe(ctx, {8, 4, 4, 2, true});
  Tensor x3 = ctx.input(f32, {2, 3, 8}, "x3");
  Tensor y3 = moe(x3);
  Tensor y2 = moe(x3.reshape({6, 8}));
  ASSERT_EQ(y3.shape(), Shape({2, 3, 8}));
  Graph g = Graph::forward({y3, y2});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  moe.init(3);
  std::vector<float> xv(48);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::sin(double(i)));
  x3.set(xv);
  cpu.compute(g);
  EXPECT_EQ(y3.get<float>(), y2.get<float>());
}

TEST(NnMoe, BadOptionsAndInputsAreErrors) {
  Context ctx;
  EXPECT_THROW(nn::MoeFeedForward(ctx, {8, 4, 4, 5, true}), Error);  // top_k > experts
  nn::MoeFeedForward moe(ctx, {8, 4, 4, 2, true});
  try {
    (void)moe(ctx.input(f32, {3, 7}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("expects inputs [..., 8]"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)nn::moe_route(ctx.input(f32, {3, 4}), 0, true), Error);
}

}  // namespace
}  // namespace kiln::test
