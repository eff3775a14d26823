// OptContext and fit(): a small model trains to a stated loss in about a second;
// gradient accumulation equals one big batch; results do not depend on the
// thread count or on running through the scheduler; evaluation leaves the
// gradients alone; bad configurations are kiln::Errors.
#include <gtest/gtest.h>

#include <chrono>

#include "common/error_check.h"
#include "kiln/ext/sched.h"
#include "opt_test_util.h"

namespace kiln::test {
namespace {

FitOptions quiet(int64_t epochs) {
  FitOptions o;
  o.epochs = epochs;
  o.progress = false;
  return o;
}

// The CI check of the training API: 3 blobs, 1500 samples, MLP 2-16-3, AdamW.
TEST(OptContext, TrainsSmallModelToStatedLoss) {
  const auto t0 = std::chrono::steady_clock::now();
  Dataset data = make_blobs(1500, 1);
  Mlp mlp(50);
  OptConfig cfg = mlp.config(100);
  AdamWParams ap;
  ap.lr = 0.02f;
  cfg.schedule = schedule::constant({ap, {}});
  OptContext opt(cfg);
  mlp.init(11);
  FitOptions o = quiet(20);
  o.val_split = 0.2;
  const std::vector<EpochResult> h = fit(opt, data, o);
  ASSERT_EQ(h.size(), 20u);
  EXPECT_EQ(opt.epoch(), 20);
  EXPECT_EQ(opt.step(), 20 * 12);  // 1200 training samples / logical batch 100
  const EpochResult& last = h.back();
  EXPECT_EQ(last.train.n_samples, 1200);
  EXPECT_EQ(last.val.n_samples, 300);
  // Bayes error of these blobs is ~1%; the loss of a good fit is ~0.05.
  EXPECT_LT(last.train.loss(), 0.12);
  EXPECT_LT(last.val.loss(), 0.15);
  EXPECT_GT(last.val.accuracy(), 0.95);
  EXPECT_LT(h.front().train.loss(), h.back().train.loss() + 1.0);  // sanity
  EXPECT_GT(h.front().train.loss(), last.train.loss());
  EXPECT_TRUE(std::isfinite(last.val.loss_unc()));
  EXPECT_GE(last.val.accuracy_unc(), 0.0);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(secs, 20.0);  // ~0.2 s on one core; generous for sanitizer builds
}

// Gradients of 4 physical batches of 8, scaled by 8/32, then one step: the same
// parameters as one step on the logical batch of 32 (within 1e-5).
TEST(OptContext, AccumulationEqualsOneBigBatch) {
  for (OptimizerType kind : {OptimizerType::adamw, OptimizerType::sgd}) {
    Dataset data = make_blobs(256, 2);
    OptimizerParams op;
    op.adamw.lr = 0.01f;
    op.adamw.weight_decay = 0.01f;
    op.sgd.lr = 0.1f;
    op.sgd.momentum = 0.9f;
    Mlp small(8), big(32);
    OptConfig cs = small.config(32), cb = big.config(32);
    cs.optimizer = cb.optimizer = kind;
    cs.schedule = cb.schedule = schedule::constant(op);
    OptContext a(cs), b(cb);
    EXPECT_EQ(a.accumulation_steps(), 4);
    EXPECT_EQ(b.accumulation_steps(), 1);
    small.init(5);
    big.init(5);
    FitOptions o = quiet(3);
    o.shuffle = false;
    fit(a, data, o);
    fit(b, data, o);
    EXPECT_EQ(a.step(), 24);
    EXPECT_EQ(b.step(), 24);
    const auto pa = small.params(), pb = big.params();
    for (size_t i = 0; i < pa.size(); ++i) {
      const double d = max_abs_diff(values(pa[i]), values(pb[i]));
      EXPECT_LT(d, 1e-5) << optimizer_name(kind) << " param " << pa[i].name();
    }
  }
}

TEST(OptContext, ThreadCountDoesNotChangeResults) {
  Dataset data = make_blobs(600, 3);
  std::vector<std::vector<float>> finals;
  for (int threads : {1, 2, 3}) {
    Mlp mlp(100, 64);
    OptConfig cfg = mlp.config(200);
    cfg.n_threads = threads;
    OptContext opt(cfg);
    mlp.init(9);
    fit(opt, data, quiet(2));
    finals.push_back(values(mlp.w1));
  }
  EXPECT_EQ(finals[0], finals[1]);
  EXPECT_EQ(finals[0], finals[2]);
}

// Several backends go through the scheduler: same results as one CPU backend.
TEST(OptContext, SchedulerPathMatchesSingleBackend) {
  Dataset data = make_blobs(400, 4);
  CpuBackend c1(1), c2(1);
  Mlp one(50), two(50);
  OptConfig a = one.config(100), b = two.config(100);
  a.backends = {&c1};
  b.backends = {&c1, &c2};
  OptContext oa(a), ob(b);
  one.init(3);
  two.init(3);
  FitOptions o = quiet(2);
  o.val_split = 0.25;
  auto ha = fit(oa, data, o);
  auto hb = fit(ob, data, o);
  EXPECT_LT(max_abs_diff(values(one.w2), values(two.w2)), 1e-6);
  EXPECT_NEAR(ha.back().val.loss(), hb.back().val.loss(), 1e-6);
}

TEST(OptContext, EvaluationLeavesGradientsAndParamsAlone) {
  Dataset data = make_blobs(200, 5);
  Mlp mlp(50);
  OptContext opt(mlp.config(100));
  mlp.init(1);
  data.get_batch(opt.inputs(), opt.labels(), 0);
  opt.train_batch();  // 1 of 2 physical batches: gradients pending
  EXPECT_EQ(opt.pending_batches(), 1);
  const std::vector<float> g = values(opt.grad(mlp.w1)), w = values(mlp.w1);
  Result r = evaluate(opt, data, data.all());
  EXPECT_EQ(r.n_samples, 200);
  EXPECT_EQ(r.n_batches, 4);
  EXPECT_TRUE(r.has_accuracy());
  EXPECT_EQ(values(opt.grad(mlp.w1)), g);
  EXPECT_EQ(values(mlp.w1), w);
  data.get_batch(opt.inputs(), opt.labels(), 1);
  opt.train_batch();  // completes the logical batch: a step, gradients zeroed
  EXPECT_EQ(opt.step(), 1);
  EXPECT_EQ(opt.pending_batches(), 0);
  EXPECT_NE(values(mlp.w1), w);
  for (float x : values(opt.grad(mlp.w1))) ASSERT_EQ(x, 0.0f);
}

TEST(OptContext, MseAndUserLoss) {
  // y = 2 x0 - x1 + 0.5, learnt by a linear model with MSE.
  const int64_t n = 512, B = 64;
  Dataset data(n, {2}, DataType::f32, {1}, DataType::f32, 1);
  std::mt19937_64 rng(1);
  for (int64_t i = 0; i < n; ++i) {
    const float a = float(rng() % 2001) / 1000.0f - 1.0f, b = float(rng() % 2001) / 1000.0f - 1.0f;
    data.data<float>()[size_t(2 * i)] = a;
    data.data<float>()[size_t(2 * i + 1)] = b;
    data.labels<float>()[size_t(i)] = 2 * a - b + 0.5f;
  }
  for (bool user : {false, true}) {
    Context ctx;
    Tensor x = ctx.input(f32, {B, 2}, "x"), w = ctx.param(f32, {2, 1}, "w"),
           b = ctx.param(f32, {1}, "b");
    Tensor y = matmul(x, w) + b;
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = y;
    if (user) {
      cfg.labels = ctx.input(f32, {B, 1}, "target");
      cfg.loss = LossKind::user;
      cfg.user_loss = mean(abs(y - cfg.labels));  // L1
    } else {
      cfg.loss = LossKind::mse;
    }
    AdamWParams ap;
    ap.lr = 0.05f;
    cfg.schedule = schedule::constant({ap, {}});
    cfg.n_threads = 1;
    OptContext opt(cfg);
    EXPECT_FALSE(opt.n_correct().defined());
    auto h = fit(opt, data, quiet(40));
    EXPECT_LT(h.back().train.loss(), user ? 0.05 : 0.002) << (user ? "L1" : "MSE");
    EXPECT_FALSE(h.back().train.has_accuracy());
    const auto wv = w.get<float>();
    EXPECT_NEAR(wv[0], 2.0, 0.1);
    EXPECT_NEAR(wv[1], -1.0, 0.1);
  }
}

TEST(OptContext, SchedulesReachTheOptimizer) {
  Dataset data = make_blobs(300, 6);
  Mlp mlp(50);
  OptConfig cfg = mlp.config(100);
  std::vector<StepInfo> seen;
  cfg.schedule = [&](const StepInfo& s) {
    seen.push_back(s);
    OptimizerParams p;
    p.set_lr(0.001f * float(s.step + 1));
    return p;
  };
  OptContext opt(cfg);
  mlp.init(1);
  FitOptions o = quiet(2);
  o.val_split = 0.2;  // 300 samples: 200 train (2 steps of 100), 100 validation
  int train_batches = 0, val_batches = 0, epochs = 0;
  o.on_batch = [&](const BatchInfo& b) {
    (b.train ? train_batches : val_batches)++;
    EXPECT_EQ(b.result->n_batches, b.batch + 1);
    EXPECT_EQ(b.n_batches, b.train ? 4 : 2);
  };
  o.on_epoch = [&](const EpochResult& e) {
    EXPECT_EQ(e.epoch, epochs++);
    EXPECT_EQ(e.val.n_samples, 100);
    return true;
  };
  fit(opt, data, o);
  EXPECT_EQ(train_batches, 8);
  EXPECT_EQ(val_batches, 4);
  EXPECT_EQ(epochs, 2);
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[3].step, 3);
  EXPECT_EQ(seen[3].epoch, 1);
  EXPECT_EQ(seen[3].steps_per_epoch, 2);
  EXPECT_EQ(seen[3].epochs, 2);
  EXPECT_FLOAT_EQ(opt.last_params().lr(), 0.004f);
}

TEST(OptContext, SchedulesSeeTheRunLength) {
  Dataset data = make_blobs(300, 6);
  Mlp mlp(50);
  OptConfig cfg = mlp.config(100);
  std::vector<StepInfo> seen;
  cfg.schedule = [&](const StepInfo& s) {
    seen.push_back(s);
    OptimizerParams p;
    p.set_lr(0.001f * float(s.step + 1));
    return p;
  };
  OptContext opt(cfg);
  mlp.init(1);
  fit(opt, data, quiet(2));
  ASSERT_EQ(seen.size(), 6u);
  EXPECT_EQ(seen[4].step, 4);
  EXPECT_EQ(seen[4].epoch, 1);
  EXPECT_EQ(seen[4].steps_per_epoch, 3);
  EXPECT_EQ(seen[4].epochs, 2);
  EXPECT_FLOAT_EQ(opt.last_params().lr(), 0.006f);
}

TEST(OptContext, ConfigurationErrors) {
  {
    Mlp mlp(30);
    EXPECT_EQ(
        kiln_test::error_message([&] { OptContext o(mlp.config(100)); }),
        "[opt] the logical batch 100 is not a multiple of the physical batch 30 (inputs [30, 2])");
  }
  {
    Mlp mlp(30);
    OptConfig c = mlp.config();
    c.inputs = mlp.logits;
    EXPECT_NE(kiln_test::error_message([&] { OptContext o(c); }).find("must be a leaf"),
              std::string::npos);
  }
  {
    Mlp mlp(30);
    OptConfig c = mlp.config();
    Tensor frozen = mlp.ctx->tensor(f32, {2, 16}, "frozen");
    c.params = {mlp.w1, frozen};
    EXPECT_EQ(kiln_test::error_message([&] { OptContext o(c); }),
              "[opt] tensor " + frozen.label() + " is not a param: create it with Context::param");
  }
  {
    Mlp mlp(30);
    OptConfig c = mlp.config();
    c.outputs = mlp.logits.narrow(1, 0, 1).reshape({30});
    EXPECT_NE(kiln_test::error_message([&] {
                OptContext o(c);
              }).find("cross-entropy needs logits [30, classes]"),
              std::string::npos);
  }
  {
    // Only some params trained: the others keep their values.
    Dataset data = make_blobs(60, 1);
    Mlp mlp(30);
    OptConfig c = mlp.config();
    c.params = {mlp.w2, mlp.b2};
    OptContext o(c);
    mlp.init(2);
    const auto w1 = values(mlp.w1), w2 = values(mlp.w2);
    fit(o, data, quiet(1));
    EXPECT_EQ(values(mlp.w1), w1);
    EXPECT_NE(values(mlp.w2), w2);
  }
}

TEST(OptContext, StaticAllocation) {
  Mlp mlp(100, 64);
  OptContext opt(mlp.config());
  // Leaves (params, grads, moments, inputs, labels, hp) are static; the graph's
  // intermediates are planned once.
  EXPECT_GT(opt.static_bytes(), size_t(4 * 4 * (2 * 64 + 64 + 64 * 3 + 3)));
  EXPECT_GT(opt.memory_plan().buffer_size, 0u);
  EXPECT_LE(opt.memory_plan().buffer_size, opt.memory_plan().total_size);
  EXPECT_LT(opt.n_forward_nodes(), opt.n_backward_nodes());
  EXPECT_LT(opt.n_backward_nodes(), opt.graph().size());
  std::vector<void*> before;
  for (TensorNode* n : opt.graph().nodes()) before.push_back(n->data);
  Dataset data = make_blobs(300, 1);
  fit(opt, data, quiet(2));
  for (size_t i = 0; i < before.size(); ++i) ASSERT_EQ(opt.graph().nodes()[i]->data, before[i]);
}

}  // namespace
}  // namespace kiln::test

namespace kiln::test {
namespace {

TEST(OptContext, ForwardOnlyEvaluation) {
  Dataset data = make_blobs(300, 7);
  Mlp trained(50);
  OptContext t(trained.config(100));
  trained.init(1);
  FitOptions o;
  o.epochs = 3;
  o.progress = false;
  fit(t, data, o);
  const Result want = evaluate(t, data, data.all());

  Mlp eval(50);
  OptConfig c = eval.config();
  c.forward_only = true;
  OptContext e(c);
  EXPECT_EQ(e.n_forward_nodes(), e.graph().size());
  EXPECT_LT(e.static_bytes(), t.static_bytes());
  for (size_t i = 0; i < eval.params().size(); ++i)
    eval.params()[i].set(values(trained.params()[i]));
  const Result got = evaluate(e, data, data.all());
  EXPECT_EQ(got.loss(), want.loss());
  EXPECT_EQ(got.n_correct, want.n_correct);
  EXPECT_THROW(e.train_batch(), Error);
  EXPECT_THROW(e.optimizer_step(), Error);
}

}  // namespace
}  // namespace kiln::test
