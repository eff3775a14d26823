// Evaluation never drops samples silently and never reports NaN quietly: the
// partial last batch is evaluated, a test set smaller than one
// batch gives its real loss, and a NaN loss in evaluation throws as in training.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "common/error_check.h"
#include "opt/opt_test_util.h"

namespace kiln::test {
namespace {

// The mean cross-entropy of the MLP over every sample of `range`, one batch of
// exactly range.size() samples, in a context of its own with the same weights.
double full_loss(const Mlp& m, const Dataset& ds, SampleRange range, double* acc) {
  Mlp whole(range.size());
  OptConfig c = whole.config();
  c.forward_only = true;
  OptContext opt(c);
  const std::vector<Tensor> from = m.params(), to = whole.params();
  for (size_t i = 0; i < from.size(); ++i) Tensor(to[i]).set(from[i].get<float>());
  ds.get_batch(opt.inputs(), opt.labels(), 0, range);
  Result r;
  const double l = opt.eval_batch(&r);
  *acc = r.accuracy();
  return l;
}

TEST(EvalPartial, ThePartialLastBatchIsEvaluated) {
  const Dataset ds = make_blobs(11, 3);
  Mlp m(4);
  OptContext opt(m.config());
  m.init(5);
  const Result r = evaluate(opt, ds, ds.all());
  EXPECT_EQ(r.n_samples, 11);  // 4 + 4 + 3, nothing dropped
  EXPECT_EQ(r.n_batches, 3);
  double acc = 0;
  const double want = full_loss(m, ds, ds.all(), &acc);
  EXPECT_NEAR(r.loss(), want, 1e-5);
  EXPECT_NEAR(r.accuracy(), acc, 1e-12);
}

TEST(EvalPartial, ATestSetSmallerThanOneBatch) {
  const Dataset ds = make_blobs(3, 4);
  Mlp m(8);
  OptContext opt(m.config());
  m.init(6);
  const Result r = evaluate(opt, ds, ds.all());
  EXPECT_EQ(r.n_samples, 3);
  ASSERT_TRUE(std::isfinite(r.loss())) << r.loss();
  ASSERT_TRUE(std::isfinite(r.accuracy()));
  double acc = 0;
  EXPECT_NEAR(r.loss(), full_loss(m, ds, ds.all(), &acc), 1e-5);
  EXPECT_NEAR(r.accuracy(), acc, 1e-12);
}

TEST(EvalPartial, ValidationInFitIncludesThePartialBatch) {
  Dataset ds = make_blobs(42, 5);
  Mlp m(8);
  OptContext opt(m.config());
  m.init(7);
  FitOptions o;
  o.progress = false;
  o.val_split = 0.25;
  const auto [train, val] = ds.split(o.val_split, 8);
  ASSERT_NE(val.size() % 8, 0);  // a partial validation batch
  const auto h = fit(opt, ds, o);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0].val.n_samples, val.size());
  EXPECT_EQ(h[0].train.n_samples, train.size());
}

TEST(EvalPartial, NaNInEvaluationThrows) {
  const Dataset ds = make_blobs(12, 6);
  Mlp m(4);
  OptContext opt(m.config());
  m.init(8);
  std::vector<float> w = m.w2.get<float>();
  w[0] = std::numeric_limits<float>::quiet_NaN();
  m.w2.set(w);
  EXPECT_KILN_ERROR((void)evaluate(opt, ds, ds.all()), "evaluate", "NaN");
  // A partial batch too.
  EXPECT_KILN_ERROR((void)evaluate(opt, ds, SampleRange{0, 3}), "evaluate", "NaN");
}

TEST(EvalPartial, NaNInValidationThrowsInFit) {
  // Training data is clean; one validation sample is NaN.
  Dataset ds = make_blobs(16, 7);
  ds.data<float>()[2 * 15] = std::numeric_limits<float>::quiet_NaN();
  Mlp m(4);
  OptContext opt(m.config());
  m.init(8);
  FitOptions o;
  o.progress = false;
  o.val_split = 0.5;
  EXPECT_KILN_ERROR((void)fit(opt, ds, o), "evaluate", "NaN");
}

TEST(EvalPartial, AnEmptyRangeIsAnError) {
  const Dataset ds = make_blobs(4, 6);
  Mlp m(4);
  OptContext opt(m.config());
  m.init(9);
  EXPECT_KILN_ERROR((void)evaluate(opt, ds, SampleRange{2, 2}), "evaluate", "empty");
}

TEST(EvalPartial, DatasetGivesThePartialBatch) {
  const Dataset ds = make_blobs(5, 8);
  Context ctx;
  Tensor x = ctx.input(f32, {4, kFeatures}, "x"), y = ctx.input(i32, {4}, "y");
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  EXPECT_EQ(ds.get_batch(x, y, 0), 4);
  EXPECT_EQ(ds.get_batch(x, y, 1), 1);  // sample 4, then sample 4 repeated
  const std::vector<float> v = x.get<float>();
  for (int i = 1; i < 4; ++i) {
    EXPECT_EQ(v[size_t(2 * i)], v[0]);
    EXPECT_EQ(v[size_t(2 * i + 1)], v[1]);
  }
  EXPECT_EQ(y.get<int32_t>()[0], 4 % kClasses);
  EXPECT_KILN_ERROR((void)ds.get_batch(x, y, 2), "dataset", "outside [0, 2)");
}

// The partial batch's loss comes out of the graph (OptContext's partial-batch
// tail, a per-sample mask): checked against double-precision references of the
// real rows, for each loss it supports, on one backend and through a scheduler.
struct PartialCase {
  std::vector<float> out, lab;  // outputs and f32 labels, row-major
  std::vector<int32_t> ids;     // i32 class labels
};

// Writes known logits into the MLP's output by making the model the identity:
// inputs are the logits and the context's outputs are inputs * 1.
struct Identity {
  Identity(int64_t B, int64_t C, bool class_ids, bool mse) {
    x = ctx.input(f32, {B, C}, "x");
    w = ctx.param(f32, {C}, "w");
    OptConfig c;
    c.inputs = x;
    c.outputs = x * w;
    if (mse) c.loss = LossKind::mse;
    else if (!class_ids) c.labels = ctx.input(f32, {B, C}, "probs");
    c.n_threads = 1;
    c.forward_only = true;
    config = c;
  }
  Context ctx;
  Tensor x, w;
  OptConfig config;
};

PartialCase partial_case(int64_t B, int64_t C, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-3.0f, 3.0f), p(0.0f, 1.0f);
  PartialCase k;
  for (int64_t i = 0; i < B * C; ++i) k.out.push_back(u(rng));
  for (int64_t i = 0; i < B; ++i) {
    double z = 0;
    std::vector<float> row;
    for (int64_t c = 0; c < C; ++c) row.push_back(p(rng)), z += row.back();
    for (float v : row) k.lab.push_back(float(v / z));  // probabilities (mse: targets)
    k.ids.push_back(int32_t(rng() % uint64_t(C)));
  }
  return k;
}

// Mean cross-entropy / mse and correct predictions of the first P rows, in double.
double reference(const PartialCase& k, int64_t P, int64_t C, int mode, int64_t* hits) {
  double total = 0;
  *hits = 0;
  for (int64_t i = 0; i < P; ++i) {
    const float* row = k.out.data() + i * C;
    if (mode == 2) {  // mse
      for (int64_t c = 0; c < C; ++c) {
        const double d = double(row[c]) - k.lab[size_t(i * C + c)];
        total += d * d;
      }
      continue;
    }
    double m = -INFINITY, z = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, double(row[c]));
    for (int64_t c = 0; c < C; ++c) z += std::exp(double(row[c]) - m);
    const double lse = m + std::log(z);
    const int64_t pred = std::max_element(row, row + C) - row;
    int64_t target = 0;
    if (mode == 0) {
      target = k.ids[size_t(i)];
      total += lse - row[target];
    } else {
      const float* q = k.lab.data() + i * C;
      for (int64_t c = 0; c < C; ++c) total -= double(q[c]) * (double(row[c]) - lse);
      target = std::max_element(q, q + C) - q;
    }
    *hits += pred == target;
  }
  return total / double(mode == 2 ? P * C : P);
}

TEST(EvalPartial, ThePartialLossAndAccuracyMatchTheReference) {
  const int64_t B = 8, C = 5;
  CpuBackend cpu(1), cpu2(1);
  for (int mode = 0; mode < 3; ++mode) {             // class ids, probabilities, mse
    for (int several = 0; several < 2; ++several) {  // one backend, a scheduler
      Identity m(B, C, mode == 0, mode == 2);
      if (several) m.config.backends = {&cpu, &cpu2};
      OptContext opt(m.config);
      m.w.set(std::vector<float>(size_t(C), 1.0f));
      const PartialCase k = partial_case(B, C, 40 + uint64_t(mode));
      m.x.set(k.out);
      if (mode == 0) opt.labels().set(k.ids);
      else opt.labels().set(k.lab);
      for (int64_t P : {int64_t(1), int64_t(3), B - 1, B}) {
        int64_t hits = 0;
        const double want = reference(k, P, C, mode, &hits);
        Result r;
        const double got = opt.eval_batch(&r, P);
        EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want)))
            << "mode " << mode << " several " << several << " P " << P;
        EXPECT_EQ(r.n_samples, P);
        if (mode == 2) EXPECT_FALSE(r.has_accuracy());
        else EXPECT_EQ(r.n_correct, hits) << "mode " << mode << " P " << P;
      }
    }
  }
}

TEST(EvalPartial, AUserLossCannotBeSplit) {
  Mlp m(4);
  OptConfig c = m.config();
  c.loss = LossKind::user;
  c.user_loss = sum(m.logits * m.logits);
  OptContext opt(c);
  m.init(2);
  EXPECT_KILN_ERROR((void)opt.eval_batch(nullptr, 3), "evaluate", "user loss", "partial batch");
  EXPECT_TRUE(std::isfinite(opt.eval_batch(nullptr)));  // a whole batch is fine
}

TEST(EvalPartial, EvalBatchChecksItsSampleCount) {
  Mlp m(4);
  OptContext opt(m.config());
  m.init(1);
  EXPECT_KILN_ERROR((void)opt.eval_batch(nullptr, 5), "evaluate", "[1, 4]");
}

}  // namespace
}  // namespace kiln::test
