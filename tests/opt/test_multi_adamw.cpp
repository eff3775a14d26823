// Multi-tensor AdamW (OptConfig::multi_tensor, ADAMW_STEP_MULTI): the same
// training as the per-param steps, over several steps, with and without
// clipping, with param groups, gradient accumulation, a frozen param between
// trained ones, params without memory of their own and several backends.
// Per element both run ADAMW_STEP's code (kernels/optim.cpp: AdamW::step), so
// without clipping the bits agree; clipping's norm sums the same squares in
// another order (one flat reduction instead of a sum per param), so the factor
// and everything after it agree to rounding.
#include <cmath>
#include <functional>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

struct MultiNet : nn::Module {
  nn::Linear& fc1;
  nn::LayerNorm& ln;
  nn::Linear& fc2;
  nn::Linear& head;
  explicit MultiNet(Context& ctx)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", 5, 24)),
        ln(add<nn::LayerNorm>("ln", 24)),
        fc2(add<nn::Linear>("fc2", 24, 24)),
        head(add<nn::Linear>("head", 24, 3)) {}
  Tensor forward(Tensor x) override { return head(tanh(fc2(tanh(ln(fc1(x)))))); }
};

struct MultiVariant {
  bool clip = false, groups = false, frozen = false, unallocated = false, several = false;
  int64_t logical = 0;
};

// Everything a run leaves: every param (frozen ones too), the trained ones'
// moments, and the gradient norm of each step.
struct MultiRunResult {
  std::vector<float> params, state;
  std::vector<double> norms;
  size_t multi_nodes = 0, step_nodes = 0, opt_nodes = 0;
};

MultiRunResult multi_train(const MultiVariant& v, bool multi) {
  const int64_t B = 4;
  Context ctx;
  MultiNet net(ctx);
  CpuBackend cpu(2), cpu2(1);
  if (v.frozen) {
    net.ln.weight().set_requires_grad(false);
    net.ln.bias().set_requires_grad(false);
  }
  OptConfig cfg;
  cfg.multi_tensor = multi;
  cfg.inputs = ctx.input(f32, {B, 5}, "x");
  cfg.outputs = net(cfg.inputs);
  cfg.loss = LossKind::cross_entropy;
  cfg.backends = v.several ? std::vector<Backend*>{&cpu, &cpu2} : std::vector<Backend*>{&cpu};
  cfg.schedule = schedule::constant(OptimizerParams{.adamw = {.lr = 0.02f, .weight_decay = 0.1f}});
  cfg.logical_batch = v.logical;
  if (v.clip) cfg.clip_grad_norm = 0.05f;  // below the norms seen: clipping acts
  if (v.groups) cfg.groups = weight_decay_groups(net, 0.3f);
  else cfg.model = &net;
  if (!v.unallocated) {
    net.allocate(cpu);
    net.init(11);
  }
  OptContext opt(cfg);
  if (v.unallocated) net.init(11);  // the context gave the params memory
  MultiRunResult r;
  for (int b = 0; b < 8; ++b) {
    std::vector<float> x(static_cast<size_t>(B * 5));
    std::vector<int32_t> y(static_cast<size_t>(B));
    for (size_t k = 0; k < x.size(); ++k) x[k] = float(std::sin(0.37 * double(k + 13 * b)));
    for (size_t k = 0; k < y.size(); ++k) y[k] = int32_t((k + size_t(b)) % 3);
    opt.inputs().set(x);
    opt.labels().set(y);
    const int64_t step = opt.step();
    opt.train_batch();
    if (opt.step() != step && v.clip) r.norms.push_back(opt.grad_norm());
  }
  for (const Tensor& p : net.parameters())
    for (float f : p.get<float>()) r.params.push_back(f);
  for (const Tensor& p : opt.params())
    for (const Tensor& s : {opt.state(p).m, opt.state(p).v})
      for (float f : s.get<float>()) r.state.push_back(f);
  for (size_t k = opt.n_backward_nodes(); k < opt.graph().size(); ++k) {
    const TensorNode* n = opt.graph().nodes()[k];
    r.multi_nodes += n->op == Op::ADAMW_STEP_MULTI;
    r.step_nodes += n->op == Op::ADAMW_STEP;
    ++r.opt_nodes;
  }
  return r;
}

void multi_expect_close(const std::vector<float>& a, const std::vector<float>& b, double tol,
                        const char* what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (tol == 0) {
      ASSERT_EQ(a[i], b[i]) << what << "[" << i << "]";
    } else {
      ASSERT_NEAR(a[i], b[i], tol * std::max(1.0, double(std::fabs(b[i]))))
          << what << "[" << i << "]";
    }
  }
}

void multi_compare(const MultiVariant& v) {
  const MultiRunResult old = multi_train(v, false), now = multi_train(v, true);
  EXPECT_EQ(old.multi_nodes, 0u);
  EXPECT_GT(old.step_nodes, 0u);
  EXPECT_EQ(now.step_nodes, 0u);
  EXPECT_EQ(now.multi_nodes, 1u);  // one buffer of params, far below kMaxAdamWSegments
  EXPECT_LT(now.opt_nodes, old.opt_nodes);
  // Clipping: the factor differs in its last bits, and AdamW's m / sqrt(v)
  // carries that relative difference into each update (lr 0.02, 4 steps).
  const double tol = v.clip ? 2e-5 : 0.0;
  multi_expect_close(old.params, now.params, tol, "params");
  multi_expect_close(old.state, now.state, v.clip ? 1e-5 : 0.0, "moments");
  ASSERT_EQ(old.norms.size(), now.norms.size());
  for (size_t i = 0; i < old.norms.size(); ++i) {
    EXPECT_GT(old.norms[i], 0.05) << "clipping did not act at step " << i;
    EXPECT_NEAR(old.norms[i], now.norms[i], 1e-5 * old.norms[i]) << "step " << i;
  }
}

TEST(MultiAdamW, SameAsPerParamSteps) { multi_compare({}); }
TEST(MultiAdamW, SameAsPerParamStepsWithClipping) { multi_compare({.clip = true}); }
TEST(MultiAdamW, SameAsPerParamStepsWithGroupsAndClipping) {
  multi_compare({.clip = true, .groups = true});
}
TEST(MultiAdamW, SameAsPerParamStepsWithAccumulation) {
  multi_compare({.clip = true, .groups = true, .logical = 8});
}
// The frozen LayerNorm lies between trained params in the model's buffer: the
// cover spans it, the segments skip it (its values must not move).
TEST(MultiAdamW, FrozenParamBetweenTrainedOnesStaysPut) {
  const MultiRunResult r = multi_train({.frozen = true}, true);
  multi_compare({.frozen = true});
  const std::vector<float> ln_w(24, 1.0f), ln_b(24, 0.0f);
  // named_parameters order: fc1.weight, fc1.bias, ln.weight, ln.bias, ...
  const size_t at = 5 * 24 + 24;
  multi_expect_close(
      std::vector<float>(r.params.begin() + long(at), r.params.begin() + long(at + 24)), ln_w, 0.0,
      "ln.weight");
  multi_expect_close(
      std::vector<float>(r.params.begin() + long(at + 24), r.params.begin() + long(at + 48)), ln_b,
      0.0, "ln.bias");
}
// Params without memory: the context places them, as slices of a flat owner.
TEST(MultiAdamW, SameAsPerParamStepsForParamsTheContextPlaces) {
  multi_compare({.clip = true, .unallocated = true});
}
// Several backends: the phase graphs through schedulers.
TEST(MultiAdamW, SameAsPerParamStepsOnSeveralBackends) {
  multi_compare({.clip = true, .groups = true, .several = true});
}

// The op's own checks: shapes when built, the segment table when run.
TEST(MultiAdamW, RefusesBadShapesAndSegments) {
  Context ctx;
  Tensor p = ctx.tensor(f32, {10}), g = ctx.tensor(f32, {8}), m = ctx.tensor(f32, {8}),
         v = ctx.tensor(f32, {8}), hp = ctx.tensor(f32, {1, hyper_floats<AdamWHyper>}),
         segs = ctx.tensor(i32, {2, 4});
  EXPECT_THROW((void)adamw_step_multi(p, g, m, ctx.tensor(f32, {7}), hp, segs), Error);
  EXPECT_THROW((void)adamw_step_multi(p, g, m, v, ctx.tensor(f32, {8}), hp), Error);
  EXPECT_THROW((void)adamw_step_multi(p, g, m, v, hp, ctx.tensor(f32, {2, 4})), Error);
  EXPECT_THROW((void)adamw_step_multi(p.reshape({2, 5}), g, m, v, hp, segs), Error);
  Tensor s = adamw_step_multi(p, g, m, v, hp, segs);
  Graph graph = Graph::forward(s);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  for (Tensor t : {p, g, m, v}) t.fill_zero();
  const auto h = hyper_values(adamw_hyper(AdamWParams{}, 1, 1.0f));
  hp.set(std::span<const float>(h));
  const std::vector<std::pair<std::vector<int32_t>, const char*>> tables = {
      {{0, 0, 4, 0, 5, 4, 4, 0}, ""},                // valid
      {{0, 0, 4, 0, 2, 4, 4, 0}, "update param"},    // param ranges overlap
      {{0, 4, 4, 0, 5, 0, 4, 0}, "out of bounds"},   // state offsets descend
      {{0, 0, 4, 0, 7, 4, 4, 0}, "out of bounds"},   // past the param's end
      {{0, 0, 4, 0, 5, 4, 4, 1}, "out of bounds"}};  // no group 1
  for (const auto& [rows, msg] : tables) {
    segs.set(std::span<const int32_t>(rows));
    if (!*msg) {
      EXPECT_NO_THROW(cpu.compute(graph));
      continue;
    }
    try {
      cpu.compute(graph);
      ADD_FAILURE() << "accepted a bad table, expected: " << msg;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("adamw_step_multi"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::test
