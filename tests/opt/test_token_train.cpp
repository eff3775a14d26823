// train_on_tokens: a run stopped and resumed from its checkpoint ends with the
// weights of an uninterrupted one (bit for bit, also with gradient
// accumulation), an iteration of K accumulated batches of B trains like one
// batch of K*B, evaluations come at the interval and at the end, the loss
// falls, and bad eval windows are refused before any training.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error_check.h"
#include "common/temp_dir.h"
#include "kiln/cpu.h"
#include "kiln/nn.h"
#include "kiln/token_train.h"

namespace {

constexpr int64_t kVocab = 11, kBlock = 8, kBatch = 4;

// ids [B, T] -> logits [B, T, vocab]: an embedding and a linear head.
struct Bigram : kiln::nn::Module {
  kiln::nn::Embedding& emb;
  kiln::nn::Linear& head;
  explicit Bigram(kiln::Context& ctx)
      : Module(ctx),
        emb(add<kiln::nn::Embedding>("emb", kVocab, 16)),
        head(add<kiln::nn::Linear>("head", 16, kVocab)) {}
  kiln::Tensor forward(kiln::Tensor ids) override { return head(emb(ids)); }
};

// A corpus with structure to learn: token i+1 follows token i (mod vocab),
// with a jump now and then.
kiln::TokenDataset corpus() {
  std::vector<uint16_t> ids;
  uint32_t x = 3;
  for (int i = 0; i < 4000; ++i) {
    x = (i % 37 == 0) ? (x * 7 + 3) % kVocab : (x + 1) % kVocab;
    ids.push_back(uint16_t(x));
  }
  return kiln::TokenDataset(std::move(ids), kVocab);
}

struct Trainer {
  kiln::Context ctx;
  kiln::CpuBackend cpu{1};
  Bigram model{ctx};
  std::unique_ptr<kiln::OptContext> opt;
  std::unique_ptr<kiln::TokenLossEvaluator> eval;
  // Physical batches of `batch` windows, `logical` per optimizer step (0: batch).
  explicit Trainer(int64_t batch = kBatch, int64_t logical = 0) {
    model.allocate(cpu);
    model.init(5);
    kiln::Tensor ids = ctx.input(kiln::i32, {batch, kBlock}, "ids");
    kiln::Tensor targets = ctx.input(kiln::i32, {batch, kBlock}, "targets");
    kiln::Tensor logits = model(ids);
    kiln::OptConfig oc;
    oc.inputs = ids;
    oc.outputs = logits;
    oc.labels = targets;
    oc.loss = kiln::LossKind::user;
    oc.user_loss = kiln::cross_entropy(logits.reshape({batch * kBlock, kVocab}),
                                       targets.reshape({batch * kBlock}));
    oc.model = &model;
    oc.logical_batch = logical;
    kiln::OptimizerParams p;
    p.adamw.lr = 1e-2f;
    oc.schedule = kiln::schedule::cosine(p, 3, 1e-3f, 30);
    oc.backends = {&cpu};
    opt = std::make_unique<kiln::OptContext>(oc);
    eval = std::make_unique<kiln::TokenLossEvaluator>(model, 4, kBlock, cpu);
  }
  std::vector<float> weights() const {
    std::vector<float> all;
    for (const kiln::Tensor& t : model.parameters()) {
      std::vector<float> v = t.get<float>();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  }
};

TEST(TokenTrain, ResumeEqualsUninterrupted) {
  auto [train, val] = corpus().split(0.9);
  kiln_test::TempDir dir;
  kiln::TokenTrainOptions o;
  o.iters = 30;
  o.eval_interval = 10;
  o.eval_windows = 8;
  o.progress = false;

  Trainer a;
  o.checkpoint = dir.file("a.gguf");
  std::vector<int64_t> seen;
  o.on_eval = [&](const kiln::TokenTrainEval& e) { seen.push_back(e.iter); };
  const kiln::TokenTrainResult ra = kiln::train_on_tokens(*a.opt, *a.eval, train, val, o);
  EXPECT_EQ(seen, (std::vector<int64_t>{10, 20, 30}));
  ASSERT_EQ(ra.evals.size(), 3u);
  EXPECT_LT(ra.val_loss, ra.evals[0].val_loss);
  EXPECT_LT(ra.val_loss, 0.7 * std::log(double(kVocab)));
  EXPECT_EQ(ra.first_iter, 0);
  EXPECT_EQ(ra.end_iter, 30);
  EXPECT_TRUE(std::isfinite(ra.tokens_per_s));

  o.on_eval = nullptr;
  o.checkpoint = dir.file("b.gguf");
  {
    Trainer b1;
    o.stop_after = 13;  // not at an evaluation: the last iteration evaluates and saves
    const kiln::TokenTrainResult r = kiln::train_on_tokens(*b1.opt, *b1.eval, train, val, o);
    EXPECT_EQ(r.end_iter, 13);
    EXPECT_EQ(r.evals.back().iter, 13);
  }
  Trainer b2;
  o.stop_after = 0;
  o.resume = true;
  const kiln::TokenTrainResult rb = kiln::train_on_tokens(*b2.opt, *b2.eval, train, val, o);
  EXPECT_EQ(rb.first_iter, 13);
  EXPECT_EQ(rb.val_loss, ra.val_loss);
  EXPECT_EQ(b2.weights(), a.weights());
}

TEST(TokenTrain, AccumulatedBatchesTrainLikeOneBatch) {
  auto [train, val] = corpus().split(0.9);
  kiln::TokenTrainOptions o;
  o.iters = 12;
  o.eval_interval = 6;
  o.eval_windows = 8;
  o.progress = false;
  Trainer whole(kBatch);              // one batch of 4 windows per step
  Trainer parts(kBatch / 2, kBatch);  // two batches of 2, accumulated
  ASSERT_EQ(parts.opt->accumulation_steps(), 2);
  const kiln::TokenTrainResult rw = kiln::train_on_tokens(*whole.opt, *whole.eval, train, val, o);
  const kiln::TokenTrainResult rp = kiln::train_on_tokens(*parts.opt, *parts.eval, train, val, o);
  EXPECT_EQ(parts.opt->step(), 12);
  const std::vector<float> a = whole.weights(), b = parts.weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 2e-5f) << "weight " << i;
  EXPECT_NEAR(rp.val_loss, rw.val_loss, 1e-5);
  EXPECT_NEAR(rp.evals[0].train_loss, rw.evals[0].train_loss, 1e-5);
}

TEST(TokenTrain, ResumeWithAccumulationEqualsUninterrupted) {
  auto [train, val] = corpus().split(0.9);
  kiln_test::TempDir dir;
  kiln::TokenTrainOptions o;
  o.iters = 10;
  o.eval_interval = 5;
  o.eval_windows = 8;
  o.progress = false;
  Trainer a(2, 6);  // three batches of 2 per step
  kiln::train_on_tokens(*a.opt, *a.eval, train, val, o);
  o.checkpoint = dir.file("b.gguf");
  {
    Trainer b1(2, 6);
    o.stop_after = 4;
    kiln::train_on_tokens(*b1.opt, *b1.eval, train, val, o);
  }
  Trainer b2(2, 6);
  o.stop_after = 0;
  o.resume = true;
  kiln::train_on_tokens(*b2.opt, *b2.eval, train, val, o);
  EXPECT_EQ(b2.opt->step(), 10);
  EXPECT_EQ(b2.weights(), a.weights());
}

TEST(TokenTrain, RefusesBadEvalWindowsBeforeTraining) {
  auto [train, val] = corpus().split(0.9);
  Trainer r;
  kiln::TokenTrainOptions o;
  o.iters = 5;
  o.eval_windows = 6;  // not a multiple of the evaluator's batch of 4
  o.progress = false;
  EXPECT_KILN_ERROR(kiln::train_on_tokens(*r.opt, *r.eval, train, val, o), "TokenLossEvaluator",
                    "eval windows 6", "multiple of 4");
  EXPECT_EQ(r.opt->step(), 0);
  o.eval_windows = 4000;  // more than the validation split holds
  EXPECT_KILN_ERROR(kiln::train_on_tokens(*r.opt, *r.eval, train, val, o), "TokenLossEvaluator",
                    "eval windows 4000");
  o.eval_windows = 4;
  o.resume = true;  // without a checkpoint path
  EXPECT_KILN_ERROR(kiln::train_on_tokens(*r.opt, *r.eval, train, val, o), "train_on_tokens",
                    "resume needs a checkpoint path");
}

}  // namespace
