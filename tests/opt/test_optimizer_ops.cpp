// Optimizer step ops run several times in a row on the CPU backend against a
// host implementation of torch.optim.AdamW / SGD in double: the state written
// back by one step must be what the next step reads.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error_check.h"
#include "kiln/ext/tensor_node.h"
#include "opt_test_util.h"

namespace kiln::test {
namespace {

struct Host {
  std::vector<double> p, m, v, buf;
};

std::vector<float> random_vec(size_t n, std::mt19937_64& rng, double lo, double hi) {
  std::vector<float> v(n);
  for (float& x : v) x = float(lo + (hi - lo) * (double(rng() >> 11) * (1.0 / 9007199254740992.0)));
  return v;
}

void expect_close(const std::vector<double>& want, const std::vector<float>& got, double tol,
                  const char* what, int step) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i)
    ASSERT_NEAR(want[i], got[i], tol * std::max(1.0, std::fabs(want[i])))
        << what << "[" << i << "] at step " << step;
}

TEST(OptimizerOps, AdamWMatchesTorchOverSteps) {
  Context ctx;
  const Shape s{6, 17};
  const size_t n = size_t(s.numel());
  Tensor p = ctx.tensor(f32, s, "w"), g = ctx.tensor(f32, s, "g"), m = ctx.tensor(f32, s, "m"),
         v = ctx.tensor(f32, s, "v"), hp = ctx.tensor(f32, {hyper_floats<AdamWHyper>}, "hp");
  Tensor st = adamw_step(p, g, m, v, hp);
  EXPECT_EQ(st.node()->view_src, p.node());
  Graph gr = Graph::forward(st);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  std::mt19937_64 rng(7);
  std::vector<float> p0 = random_vec(n, rng, -1, 1);
  p.set(p0);
  m.fill_zero();
  v.fill_zero();
  Host h{std::vector<double>(p0.begin(), p0.end()),
         std::vector<double>(n),
         std::vector<double>(n),
         {}};
  AdamWParams ap;
  ap.lr = 0.01f;
  ap.weight_decay = 0.05f;
  const float gscale = 0.5f;
  for (int t = 1; t <= 6; ++t) {
    std::vector<float> gv = random_vec(n, rng, -2, 2);
    g.set(gv);
    const auto hv = hyper_values(adamw_hyper(ap, t, gscale));
    hp.set(std::span<const float>(hv));
    cpu.compute(gr);
    for (size_t i = 0; i < n; ++i) {  // torch.optim.AdamW, written out
      const double gi = double(gv[i]) * gscale;
      h.p[i] *= 1 - double(ap.lr) * ap.weight_decay;
      h.m[i] = ap.beta1 * h.m[i] + (1 - double(ap.beta1)) * gi;
      h.v[i] = ap.beta2 * h.v[i] + (1 - double(ap.beta2)) * gi * gi;
      const double mh = h.m[i] / (1 - std::pow(double(ap.beta1), t));
      const double vh = h.v[i] / (1 - std::pow(double(ap.beta2), t));
      h.p[i] -= ap.lr * mh / (std::sqrt(vh) + ap.eps);
    }
    expect_close(h.p, p.get<float>(), 2e-6, "param", t);
    expect_close(h.m, m.get<float>(), 2e-6, "m", t);
    expect_close(h.v, v.get<float>(), 2e-6, "v", t);
  }
}

TEST(OptimizerOps, SgdMatchesTorchOverSteps) {
  for (bool nesterov : {false, true}) {
    Context ctx;
    const Shape s{33};
    const size_t n = 33;
    Tensor p = ctx.tensor(f32, s, "w"), g = ctx.tensor(f32, s, "g"), b = ctx.tensor(f32, s, "buf"),
           hp = ctx.tensor(f32, {hyper_floats<SgdHyper>}, "hp");
    Graph gr = Graph::forward(sgd_step(p, g, b, hp));
    CpuBackend cpu(1);
    auto buf = allocate_tensors(ctx, cpu);
    std::mt19937_64 rng(3);
    std::vector<float> p0 = random_vec(n, rng, -1, 1);
    p.set(p0);
    b.set(random_vec(n, rng, -5, 5));  // garbage: the first step must ignore it
    std::vector<double> hpv(p0.begin(), p0.end()), hb(n);
    SgdParams sp;
    sp.lr = 0.1f;
    sp.momentum = 0.9f;
    sp.dampening = nesterov ? 0.0f : 0.2f;
    sp.weight_decay = 0.01f;
    sp.nesterov = nesterov;
    for (int t = 0; t < 5; ++t) {
      std::vector<float> gv = random_vec(n, rng, -1, 1);
      g.set(gv);
      const auto hv = hyper_values(sgd_hyper(sp, t == 0, 1.0f));
      hp.set(std::span<const float>(hv));
      cpu.compute(gr);
      for (size_t i = 0; i < n; ++i) {  // torch.optim.SGD
        double d = gv[i] + double(sp.weight_decay) * hpv[i];
        hb[i] = t == 0 ? d : sp.momentum * hb[i] + (1 - double(sp.dampening)) * d;
        d = nesterov ? d + sp.momentum * hb[i] : hb[i];
        hpv[i] -= sp.lr * d;
      }
      expect_close(hpv, p.get<float>(), 2e-6, "param", t);
      expect_close(hb, b.get<float>(), 2e-6, "buf", t);
    }
  }
}

TEST(OptimizerOps, PlainSgd) {
  Context ctx;
  Tensor p = ctx.tensor(f32, {4}, "w"), g = ctx.tensor(f32, {4}, "g"),
         hp = ctx.tensor(f32, {hyper_floats<SgdHyper>}, "hp");
  Graph gr = Graph::forward(sgd_step(p, g, Tensor(), hp));
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  p.set({1.0f, 2.0f, 3.0f, 4.0f});
  g.set({1.0f, -1.0f, 0.5f, 0.0f});
  SgdParams sp;
  sp.lr = 0.5f;
  const auto hv = hyper_values(sgd_hyper(sp, true, 2.0f));
  hp.set(std::span<const float>(hv));
  cpu.compute(gr);
  EXPECT_EQ(p.get<float>(), (std::vector<float>{0.0f, 3.0f, 2.5f, 4.0f}));
}

TEST(OptimizerOps, HyperParameters) {
  AdamWParams ap;
  const AdamWHyper h = adamw_hyper(ap, 1, 0.25f);
  EXPECT_FLOAT_EQ(h.lr, 1e-3f);
  EXPECT_FLOAT_EQ(h.bias_correction1, 10.0f);      // 1 / (1 - 0.9)
  EXPECT_NEAR(h.bias_correction2, 1000.0f, 0.05);  // 1 / (1 - 0.999f)
  EXPECT_FLOAT_EQ(h.grad_scale, 0.25f);
  EXPECT_NEAR(adamw_hyper(ap, 100000, 1).bias_correction2, 1.0f, 1e-6);
  EXPECT_THROW(adamw_hyper(ap, 0, 1), Error);
  SgdParams sp;
  sp.nesterov = true;
  const SgdHyper s = sgd_hyper(sp, true, 1);
  EXPECT_EQ(s.nesterov, 1.0f);
  EXPECT_EQ(s.first_step, 1.0f);
  // The tensor holds the struct's fields in order; grad_scale is found by name.
  const auto v = hyper_values(h);
  EXPECT_EQ(v.size(), size_t(hyper_floats<AdamWHyper>));
  EXPECT_EQ(v[size_t(hyper_grad_scale_index<AdamWHyper>())], 0.25f);
  EXPECT_EQ(hyper_from_values<AdamWHyper>(v.data()).bias_correction1, h.bias_correction1);
  EXPECT_EQ(hyper_values(s)[size_t(hyper_grad_scale_index<SgdHyper>())], 1.0f);
}

TEST(OptimizerOps, BuilderErrors) {
  Context ctx;
  Tensor p = ctx.param(f32, {4, 3}, "w"), g = ctx.tensor(f32, {4, 3}), m = ctx.tensor(f32, {4, 3}),
         v = ctx.tensor(f32, {3, 4}), hp = ctx.tensor(f32, {8}), hp7 = ctx.tensor(f32, {7}),
         hps = ctx.tensor(f32, {hyper_floats<SgdHyper>});
  EXPECT_EQ(kiln_test::error_message([&] { adamw_step(p, g, m, v, hp); }),
            "[adamw_step] v is [3, 4] but param " + p.label() + " is [4, 3]");
  EXPECT_EQ(kiln_test::error_message([&] { adamw_step(p, g, m, m, hp7); }),
            "[adamw_step] hyper-parameters must be f32 [8], got [7]");
  EXPECT_THROW(sgd_step(p.T().contiguous(), g, Tensor(), hps), Error);
  EXPECT_EQ(kiln_test::error_message([&] { sgd_step(p, g, Tensor(), hp); }),
            "[sgd_step] hyper-parameters must be f32 [7], got [8]");
  EXPECT_NE(kiln_test::error_message([&] {
              sgd_step(p.narrow(0, 0, 2), g.narrow(0, 0, 2), Tensor(), hps);
            }).find("is a view"),
            std::string::npos);
  EXPECT_NE(kiln_test::error_message([&] {
              sgd_step(p, ctx.tensor(i32, {4, 3}), Tensor(), hps);
            }).find("[sgd_step] grad must be f32"),
            std::string::npos);
  // An optimizer step is an in-place op: never on a gradient path.
  Tensor x = ctx.input(f32, {4, 3});
  Tensor upd = sgd_step(p, g, Tensor(), hps);
  Tensor loss = sum(upd * x);
  Graph gr = Graph::forward(loss);
  EXPECT_THROW(gr.backward(loss), Error);
}

}  // namespace
}  // namespace kiln::test
