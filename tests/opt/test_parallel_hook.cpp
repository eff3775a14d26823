// The training layer's side of data parallelism, with a fake ParallelHook (no
// MPI): the backward pass pauses at the hook's cut points with those gradients
// already final, last layer first; the optimizer step averages over ranks; a
// rank other than 0 writes no checkpoint; fit() gives each rank its slice of
// every batch. tests/dist_mpi proves the real thing across processes.
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "common/temp_dir.h"
#include "kiln/ext/tensor_node.h"
#include "opt_test_util.h"

namespace kiln::test {
namespace {

// Pretends to be rank `rank` of `ranks` whose peers computed the very same
// gradients: the "sum over ranks" multiplies by the number of ranks.
struct FakeHook : ParallelHook {
  FakeHook(int r, int n, bool cut_each) : rank_(r), ranks_(n), cut_each_(cut_each) {}
  int rank() const override { return rank_; }
  int size() const override { return ranks_; }
  std::vector<size_t> attach(std::span<const Tensor> g) override {
    grads.assign(g.begin(), g.end());
    std::vector<size_t> cuts;
    if (cut_each_)
      for (size_t i = 1; i <= g.size(); ++i) cuts.push_back(i);
    else cuts.push_back(g.size());
    return cuts;
  }
  void grads_ready(size_t count) override {
    notified.push_back(count);
    for (size_t i = seen.size(); i < count; ++i) seen.push_back(values(grads[i]));
  }
  void finish_grads() override {
    ++finishes;
    for (size_t i = 0; i < grads.size(); ++i) {
      if (i < seen.size() && values(grads[i]) != seen[i]) changed_after_ready = true;
      std::vector<float> v = values(grads[i]);
      for (float& x : v) x *= float(ranks_);
      grads[i].set(v);
    }
    seen.clear();
  }
  void broadcast(std::span<const Tensor> ts) override { broadcasts += int(ts.size()); }
  void sum(std::span<double> v) override {
    ++sums;
    if (peers_sum) return peers_sum(v);
    for (double& x : v) x *= ranks_;
  }
  std::function<void(std::span<double>)> peers_sum;  // what the other ranks add, if not the same

  int rank_, ranks_;
  bool cut_each_;
  std::vector<Tensor> grads;
  std::vector<size_t> notified;
  std::vector<std::vector<float>> seen;
  bool changed_after_ready = false;
  int finishes = 0, broadcasts = 0, sums = 0;
};

TEST(ParallelHook, BackwardPausesWithFinishedGradientsLastLayerFirst) {
  Dataset data = make_blobs(64, 3);
  Mlp mlp(16);
  FakeHook hook(0, 1, /*cut_each=*/true);
  OptConfig cfg = mlp.config();
  cfg.parallel = &hook;
  OptContext opt(cfg);
  mlp.init(5);
  ASSERT_EQ(hook.grads.size(), 4u);
  // Backward order: the output layer's gradients are finished first.
  EXPECT_EQ(hook.grads[0], opt.grad(mlp.b2));
  EXPECT_EQ(hook.grads[1], opt.grad(mlp.w2));
  EXPECT_EQ(hook.grads.back(), opt.grad(mlp.w1));
  // ... and lie one after the other in memory in that order.
  for (size_t i = 1; i < hook.grads.size(); ++i)
    EXPECT_GT(hook.grads[i].node()->data, hook.grads[i - 1].node()->data);
  for (int b = 0; b < 3; ++b) {
    data.get_batch(opt.inputs(), opt.labels(), b);
    opt.train_batch();
  }
  EXPECT_EQ(hook.notified, (std::vector<size_t>{1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4}));
  EXPECT_EQ(hook.finishes, 3);
  EXPECT_FALSE(hook.changed_after_ready);  // a gradient reported ready was final
  EXPECT_EQ(hook.broadcasts, 12);          // params and AdamW m, v once, before the first pass
}

// With ranks that computed the same gradients, the average equals one rank's:
// the parameters match a run without a hook (the step scales by 1/ranks).
TEST(ParallelHook, StepAveragesOverRanks) {
  for (int accumulate : {1, 2}) {
    Dataset data = make_blobs(128, 4);
    Mlp a(16), b(16);
    FakeHook hook(0, 3, false);
    OptConfig ca = a.config(16 * accumulate), cb = b.config(16 * accumulate);
    cb.parallel = &hook;
    OptContext oa(ca), ob(cb);
    a.init(7);
    b.init(7);
    for (int i = 0; i < 4 * accumulate; ++i) {
      data.get_batch(oa.inputs(), oa.labels(), i);
      data.get_batch(ob.inputs(), ob.labels(), i);
      oa.train_batch();
      ob.train_batch();
    }
    EXPECT_EQ(hook.finishes, 4);
    EXPECT_EQ(hook.notified.size(), 4u);  // only the backward before a step reports
    for (size_t i = 0; i < 4; ++i)
      EXPECT_LT(max_abs_diff(values(a.params()[i]), values(b.params()[i])), 1e-6)
          << "accumulate " << accumulate;
  }
}

TEST(ParallelHook, OnlyRankZeroWritesCheckpoints) {
  const kiln_test::TempDir tmp;  // one per test run: concurrent runs do not share files
  const std::filesystem::path& dir = tmp.path();
  for (int r : {0, 1}) {
    Mlp mlp(8);
    FakeHook hook(r, 2, false);
    // The other rank adds rank 0's success flag (1) when this is rank 1, 0 when rank 0.
    hook.peers_sum = [r](std::span<double> v) { v[0] += r == 1 ? 1.0 : 0.0; };
    OptConfig cfg = mlp.config();
    cfg.parallel = &hook;
    OptContext opt(cfg);
    mlp.init(1);
    const std::string path = (dir / ("rank" + std::to_string(r) + ".gguf")).string();
    std::filesystem::remove(path);
    opt.save(path);
    EXPECT_EQ(std::filesystem::exists(path), r == 0) << "rank " << r;
    EXPECT_EQ(hook.sums, 1);  // the success flag doubles as the barrier
  }
}

// fit() on "rank 1 of 2" trains on positions [B, 2B) of every global batch of
// 2B, and the results count samples of all ranks.
TEST(ParallelHook, FitTakesThisRanksSliceOfEveryBatch) {
  Dataset data = make_blobs(96, 5);
  Mlp mlp(8);
  FakeHook hook(1, 2, false);
  OptConfig cfg = mlp.config();
  cfg.parallel = &hook;
  OptContext opt(cfg);
  mlp.init(2);
  FitOptions o;
  o.epochs = 1;
  o.progress = false;
  o.shuffle = false;
  std::vector<float> first_inputs;
  o.on_batch = [&](const BatchInfo& bi) {
    if (bi.batch == 0) first_inputs = values(opt.inputs());
  };
  const std::vector<EpochResult> h = fit(opt, data, o);
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(opt.step(), 96 / 16);       // 6 global batches of 2 x 8
  EXPECT_EQ(h[0].train.n_samples, 96);  // 48 here, doubled by the fake sum
  const std::span<const float> x = data.data<float>();
  ASSERT_EQ(first_inputs.size(), size_t(8 * kFeatures));
  for (size_t i = 0; i < first_inputs.size(); ++i) EXPECT_EQ(first_inputs[i], x[8 * kFeatures + i]);
}

}  // namespace
}  // namespace kiln::test
