// Learning-rate schedules, result statistics and progress output widths.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/opt.h"

namespace kiln {
namespace {

StepInfo at(int64_t step, int64_t epoch = 0, int64_t spe = 10, int64_t epochs = 10) {
  return StepInfo{step, epoch, spe, epochs};
}

TEST(Schedule, Constant) {
  OptimizerParams p;
  p.adamw.lr = 0.5f;
  EXPECT_EQ(schedule::constant(p)(at(123)).adamw.lr, 0.5f);
  EXPECT_EQ(schedule::constant()(at(0)).adamw.lr, 1e-3f);
}

TEST(Schedule, StepDecay) {
  OptimizerParams p;
  p.set_lr(1.0f);
  auto f = schedule::step_decay(p, 3, 0.1f);
  EXPECT_FLOAT_EQ(f(at(0, 0)).adamw.lr, 1.0f);
  EXPECT_FLOAT_EQ(f(at(0, 2)).adamw.lr, 1.0f);
  EXPECT_FLOAT_EQ(f(at(0, 3)).adamw.lr, 0.1f);
  EXPECT_FLOAT_EQ(f(at(0, 7)).sgd.lr, 0.01f);
  EXPECT_THROW(schedule::step_decay(p, 0, 0.5f), Error);
}

TEST(Schedule, CosineWithWarmup) {
  OptimizerParams p;
  p.set_lr(1.0f);
  auto f = schedule::cosine(p, 10, 0.1f);  // total from StepInfo: 100 steps
  EXPECT_FLOAT_EQ(f(at(0)).adamw.lr, 0.1f);
  EXPECT_FLOAT_EQ(f(at(4)).adamw.lr, 0.5f);
  EXPECT_FLOAT_EQ(f(at(9)).adamw.lr, 1.0f);
  EXPECT_FLOAT_EQ(f(at(10)).adamw.lr, 1.0f);
  EXPECT_NEAR(f(at(55)).adamw.lr, 0.55f, 1e-6);  // half way: (1 + 0.1) / 2
  EXPECT_NEAR(f(at(100)).adamw.lr, 0.1f, 1e-6);
  EXPECT_NEAR(f(at(500)).adamw.lr, 0.1f, 1e-6);
  // Explicit length; unknown length stays at the peak after warm-up.
  EXPECT_NEAR(schedule::cosine(p, 0, 0.0f, 20)(at(10, 0, 0, 0)).sgd.lr, 0.5f, 1e-6);
  EXPECT_FLOAT_EQ(schedule::cosine(p, 2, 0.0f)(at(50, 0, 0, 0)).adamw.lr, 1.0f);
}

TEST(Result, Statistics) {
  Result r;
  EXPECT_TRUE(std::isnan(r.loss()));
  r.add(1.0, 10, 7);
  EXPECT_TRUE(std::isnan(r.loss_unc()));
  r.add(3.0, 10, 9);
  EXPECT_DOUBLE_EQ(r.loss(), 2.0);
  EXPECT_DOUBLE_EQ(r.loss_unc(), 1.0);  // sd sqrt(2) of the batch losses / sqrt(2)
  EXPECT_DOUBLE_EQ(r.accuracy(), 0.8);
  EXPECT_DOUBLE_EQ(r.accuracy_unc(), std::sqrt(0.8 * 0.2 / 20));
  Result reg;
  reg.add(0.5, 4);
  EXPECT_FALSE(reg.has_accuracy());
  EXPECT_TRUE(std::isnan(reg.accuracy()));
  EXPECT_EQ(format_result(reg), "loss 0.5000");
  EXPECT_EQ(format_result(r), "loss 2.0000+-1.0000 acc 80.00+-8.94%");
}

TEST(Progress, DurationsAndLines) {
  EXPECT_EQ(format_duration(5.2), "0:05");
  EXPECT_EQ(format_duration(754), "12:34");
  EXPECT_EQ(format_duration(3723), "1:02:03");
  Result r;
  r.add(0.0110, 500, 499);
  r.add(0.0130, 500, 498);
  ProgressBar bar("train", 57000, false);
  const std::string l = bar.line(28500, r, 3.0);
  EXPECT_LE(l.size(), 79u) << l;
  EXPECT_EQ(l.rfind("train [", 0), 0u) << l;
  EXPECT_NE(l.find("28500/57000 loss 0.0120+-0.0010 acc 99.70+-0.17% 0:03 eta 0:03"),
            std::string::npos)
      << l;
  // Extreme values never exceed 80 columns (the bar shrinks, then the text is cut).
  Result huge;
  huge.add(123456789.0, 1000000000, 1);
  huge.add(-98765432.1, 1000000000, 1);
  ProgressBar big("validation", int64_t(1) << 50, false);
  for (double el : {0.0, 1.0, 1e5, 1e9}) EXPECT_LE(big.line(12345, huge, el).size(), 80u);
  EpochResult e;
  e.epoch = 29;
  e.train = r;
  e.val = r;
  e.seconds = 3.21;
  const std::string el = epoch_line(e, 30);
  EXPECT_EQ(el, "[30/30] train 0.0120+-0.0010 99.70+-0.17% val 0.0120+-0.0010 99.70+-0.17% 3.2s");
  EXPECT_LE(el.size(), 80u);
  e.train = huge;
  e.val = huge;
  EXPECT_LE(epoch_line(e, 1000000).size(), 80u);
}

}  // namespace
}  // namespace kiln
