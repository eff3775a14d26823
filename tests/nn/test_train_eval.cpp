// One set of weights, two graphs: a training graph (batch 8, dropout on) run by
// an OptContext and an evaluation graph (batch 1, dropout off) run directly;
// Dropout's behaviour in each mode.
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "nn_test_util.h"
#include "reference.h"

namespace kiln::test {
namespace {

struct TrainEvalNet : nn::Module {
  nn::Linear& fc1;
  nn::Dropout& drop;
  nn::Linear& fc2;
  explicit TrainEvalNet(Context& ctx)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", 3, 16)),
        drop(add<nn::Dropout>("drop", 0.25f)),
        fc2(add<nn::Linear>("fc2", 16, 2)) {}
  Tensor forward(Tensor x) override { return fc2(drop(relu(fc1(x)))); }
};

Values net_ref(const TrainEvalNet& n, const Values& x, int64_t rows) {
  Values h = ref::linear(x, rows, 3, as_double(n.fc1.weight()), as_double(n.fc1.bias()), 16);
  for (double& v : h) v = std::max(v, 0.0);
  return ref::linear(h, rows, 16, as_double(n.fc2.weight()), as_double(n.fc2.bias()), 2);
}

TEST(NnTrainEval, TrainingAndEvaluationGraphsShareTheWeights) {
  Context ctx;
  TrainEvalNet net(ctx);
  CpuBackend cpu(1);
  net.allocate(cpu);
  net.init(11);

  // Training graph: batch 8, dropout active.
  Tensor xt = ctx.input(f32, {8, 3}, "x_train");
  Tensor yt = net(xt);
  OptConfig cfg;
  cfg.inputs = xt;
  cfg.outputs = yt;
  cfg.loss = LossKind::mse;
  cfg.model = &net;  // its params, and its dropout seed written per pass
  cfg.backends = {&cpu};
  cfg.schedule = schedule::constant(OptimizerParams{}.set_lr(0.05f));
  OptContext opt(cfg);
  ASSERT_EQ(net.dropout_seeds().size(), 1u);

  // Evaluation graph: batch 1, built in eval mode, run without an OptContext.
  net.eval();
  Tensor xe = ctx.input(f32, {1, 3}, "x_eval");
  Tensor ye = net(xe);
  Graph ge = Graph::forward(ye);
  for (const TensorNode* n : ge.nodes())
    EXPECT_NE(n->op, Op::RAND_MASK) << "dropout in the eval graph";
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(ge);
  // Same memory, not a copy.
  for (Tensor p : net.parameters()) EXPECT_TRUE(p.has_data());
  const void* w_before = net.fc1.weight().node()->data;

  const std::vector<float> x1 = {0.3f, -1.2f, 0.8f};
  auto eval_matches_reference = [&] {
    xe.set(x1);
    cpu.compute(ge);
    expect_close(as_double(ye), net_ref(net, Values(x1.begin(), x1.end()), 1), 1e-5, 1e-4,
                 "eval output");
  };
  eval_matches_reference();
  const Values before = as_double(ye);

  // Train a few steps; the eval graph then sees the updated weights.
  EXPECT_EQ(opt.params(), net.parameters());
  for (int s = 0; s < 5; ++s) {
    opt.inputs().set(random_values(24, 100 + s));
    opt.labels().set(random_values(16, 200 + s));
    opt.train_batch();
    // A new dropout mask per training pass: the step seed is the pass count.
    EXPECT_EQ(net.dropout_seeds()[0].get<int32_t>(), std::vector<int32_t>{s});
  }
  EXPECT_EQ(net.fc1.weight().node()->data, w_before);
  eval_matches_reference();
  EXPECT_NE(as_double(ye), before);
}

TEST(NnTrainEval, DropoutOnlyInTrainingGraphs) {
  Context ctx;
  nn::Dropout drop(ctx, 0.5f);
  Tensor x = ctx.input(f32, {4000}, "x");
  Tensor yt = drop(x);
  drop.eval();
  Tensor ye = drop(x);
  EXPECT_EQ(ye, x);  // no node at all in evaluation mode
  drop.train();
  nn::Dropout none(ctx, 0.0f);
  EXPECT_EQ(none(x), x);

  CpuBackend cpu(1);
  Graph g = Graph::forward(yt);
  auto buf = allocate_tensors(ctx, cpu);
  x.set(std::vector<float>(4000, 1.0f));
  auto run = [&](int64_t step) {
    drop.set_dropout_step(step);
    cpu.compute(g);
    return yt.get<float>();
  };
  const std::vector<float> a = run(0), b = run(1), a2 = run(0);
  int zeros = 0;
  for (float v : a) {
    EXPECT_TRUE(v == 0.0f || v == 2.0f) << v;  // kept values scaled by 1/(1-p)
    zeros += v == 0.0f;
  }
  EXPECT_NEAR(zeros / 4000.0, 0.5, 0.05);
  EXPECT_NE(a, b);   // a new step seed: a new mask
  EXPECT_EQ(a, a2);  // the same step: the same mask
}

}  // namespace
}  // namespace kiln::test
