// Param groups with their own weight decay, and gradient clipping by global
// norm (clip_grad_norm_ semantics), against updates computed in the test from
// the accumulated gradients.
#include <cmath>

#include <gtest/gtest.h>

#include "kiln/kiln.h"

namespace kiln::test {
namespace {

struct ClipNet : nn::Module {
  nn::Linear& fc1;
  nn::LayerNorm& ln;
  nn::Linear& fc2;
  explicit ClipNet(Context& ctx)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", 3, 6)),
        ln(add<nn::LayerNorm>("ln", 6)),
        fc2(add<nn::Linear>("fc2", 6, 2)) {}
  Tensor forward(Tensor x) override { return fc2(tanh(ln(fc1(x)))); }
};

// The net, allocated and initialised, and an SGD context over it (mse loss,
// physical batch 4) built from `cfg` with the net as OptConfig::model.
struct Fixture {
  Context ctx;
  ClipNet net{ctx};
  CpuBackend cpu{1};
  std::unique_ptr<OptContext> opt;
  explicit Fixture(OptConfig cfg) {
    net.allocate(cpu);
    net.init(3);
    cfg.inputs = ctx.input(f32, {4, 3}, "x");
    cfg.outputs = net(cfg.inputs);
    cfg.loss = LossKind::mse;
    cfg.backends = {&cpu};
    cfg.optimizer = OptimizerType::sgd;
    cfg.model = &net;
    opt = std::make_unique<OptContext>(cfg);
  }
  void batch(int i) {
    std::vector<float> x(12), y(8);
    for (size_t k = 0; k < x.size(); ++k) x[k] = float(std::sin(1.7 * double(k + 5 * i)));
    for (size_t k = 0; k < y.size(); ++k) y[k] = float(std::cos(0.9 * double(k + 3 * i)));
    opt->inputs().set(x);
    opt->labels().set(y);
  }
};

std::vector<double> get(Tensor t) {
  const auto v = t.get<float>();
  return std::vector<double>(v.begin(), v.end());
}

TEST(ParamGroups, NanoGptSplitByDims) {
  Context ctx;
  ClipNet net(ctx);
  nn::Embedding emb(ctx, 4, 2);
  const auto groups = weight_decay_groups(net, 0.1f);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].weight_decay, 0.1f);
  EXPECT_EQ(groups[0].params, (std::vector<Tensor>{net.fc1.weight(), net.fc2.weight()}));
  EXPECT_EQ(groups[1].weight_decay, 0.0f);
  EXPECT_EQ(groups[1].params,
            (std::vector<Tensor>{net.fc1.bias(), net.ln.weight(), net.ln.bias(), net.fc2.bias()}));
  const auto e = weight_decay_groups(emb, 0.2f);  // embeddings decay; no empty group
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].params, std::vector<Tensor>{emb.weight()});
}

TEST(ParamGroups, EachGroupStepsWithItsOwnWeightDecay) {
  const float lr = 0.1f, wd = 0.5f;
  OptConfig cfg;
  cfg.schedule = schedule::constant(OptimizerParams{.sgd = {.lr = lr, .weight_decay = 0.25f}});
  Context ctx;
  ClipNet net(ctx);
  CpuBackend cpu(1);
  net.allocate(cpu);
  net.init(3);
  OptConfig c2 = cfg;
  c2.inputs = ctx.input(f32, {4, 3}, "x");
  c2.outputs = net(c2.inputs);
  c2.loss = LossKind::mse;
  c2.backends = {&cpu};
  c2.optimizer = OptimizerType::sgd;
  c2.groups = weight_decay_groups(net, wd);
  c2.groups.push_back({{}, std::nullopt});  // an empty group is an error
  EXPECT_THROW(OptContext bad(c2), Error);
  c2.groups.pop_back();
  c2.groups[1].weight_decay.reset();  // unset: the schedule's 0.25
  OptContext opt(c2);
  std::vector<float> x(12), y(8);
  for (size_t k = 0; k < x.size(); ++k) x[k] = float(std::sin(1.7 * double(k)));
  for (size_t k = 0; k < y.size(); ++k) y[k] = float(std::cos(0.9 * double(k)));
  opt.inputs().set(x);
  opt.labels().set(y);
  opt.forward_backward();
  std::vector<std::vector<double>> p0, g0;
  for (Tensor p : net.parameters()) {
    p0.push_back(get(p));
    g0.push_back(get(opt.grad(p)));
  }
  opt.optimizer_step();
  const auto params = net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const double decay = params[i].ndim() >= 2 ? wd : 0.25;
    const auto now = get(params[i]);
    for (size_t k = 0; k < now.size(); ++k)
      EXPECT_NEAR(now[k], p0[i][k] - lr * (g0[i][k] + decay * p0[i][k]), 1e-6)
          << params[i].name() << "[" << k << "]";
  }
}

// clip_grad_norm_: total = sqrt(sum of squares of every gradient), gradients
// scaled by max/(total + 1e-6) when that is below 1. With two physical batches
// per step the gradient is the mean of the two (gscale 1/2).
void check_clipping(float max_norm, bool expect_clipped) {
  const float lr = 0.5f;
  OptConfig cfg;
  cfg.schedule = schedule::constant(OptimizerParams{.sgd = {.lr = lr}});
  cfg.clip_grad_norm = max_norm;
  cfg.logical_batch = 8;
  Fixture s(cfg);
  OptContext& opt = *s.opt;
  EXPECT_EQ(opt.params(), s.net.parameters());
  EXPECT_TRUE(std::isnan(opt.grad_norm()));
  s.batch(0);
  opt.train_batch();
  s.batch(1);
  opt.forward_backward();  // the second physical batch, without the step
  std::vector<std::vector<double>> p0, g0;
  double sq = 0;
  for (Tensor p : s.net.parameters()) {
    p0.push_back(get(p));
    g0.push_back(get(opt.grad(p)));
    for (double& g : g0.back()) {
      g *= 0.5;  // the mean over the two physical batches
      sq += g * g;
    }
  }
  const double total = std::sqrt(sq), coef = std::min(1.0, max_norm / (total + 1e-6));
  EXPECT_EQ(coef < 1.0, expect_clipped) << "total norm " << total;
  opt.optimizer_step();
  EXPECT_NEAR(opt.grad_norm(), total, 1e-5 * total);
  const auto params = s.net.parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const auto now = get(params[i]);
    for (size_t k = 0; k < now.size(); ++k)
      EXPECT_NEAR(now[k], p0[i][k] - lr * coef * g0[i][k], 1e-6)
          << params[i].name() << "[" << k << "]";
  }
}

TEST(GradClipping, ScalesByMaxOverTotalNormWhenLarger) { check_clipping(0.05f, true); }
TEST(GradClipping, LeavesSmallGradientsAlone) { check_clipping(1e6f, false); }

TEST(GradClipping, RejectsNegativeMaxNorm) {
  OptConfig cfg;
  cfg.clip_grad_norm = -1.0f;
  EXPECT_THROW(Fixture s(cfg), Error);
}

}  // namespace
}  // namespace kiln::test
