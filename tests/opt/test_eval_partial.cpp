// Evaluation never drops samples silently and never reports NaN quietly: the
// partial last batch is evaluated, a test set smaller than one
// batch gives its real loss, and a NaN loss in evaluation throws as in training.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

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

TEST(EvalPartial, EvalBatchChecksItsSampleCount) {
  Mlp m(4);
  OptContext opt(m.config());
  m.init(1);
  EXPECT_KILN_ERROR((void)opt.eval_batch(nullptr, 5), "evaluate", "[1, 4]");
}

}  // namespace
}  // namespace kiln::test
