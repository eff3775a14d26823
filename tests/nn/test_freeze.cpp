// Frozen params (Module::freeze, Tensor::set_requires_grad): no gradient node,
// accumulator, optimizer state or gradient memory; gradients still flow
// through frozen weights to the trainable ones below.
#include "../common/error_check.h"
#include "kiln/ext/tensor_node.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

struct Mlp3 : nn::Module {
  nn::Linear& fc1;
  nn::Linear& fc2;
  nn::Linear& fc3;
  Mlp3(Context& ctx, int64_t in, int64_t hidden, int64_t out)
      : Module(ctx),
        fc1(add<nn::Linear>("fc1", in, hidden)),
        fc2(add<nn::Linear>("fc2", hidden, hidden)),
        fc3(add<nn::Linear>("fc3", hidden, out)) {}
  Tensor forward(Tensor x) override { return fc3(relu(fc2(relu(fc1(x))))); }
};

// The gradients of fc1 with and without fc2/fc3 frozen: the same values, and no
// gradient nodes for the frozen weights.
TEST(NnFreeze, GradientsFlowThroughFrozenWeights) {
  std::vector<std::vector<float>> got;
  for (bool frozen : {false, true}) {
    Context ctx;
    Mlp3 m(ctx, 5, 7, 3);
    CpuBackend cpu(1);
    m.allocate(cpu);
    m.init(3);
    if (frozen) {
      m.fc2.freeze();
      m.fc3.weight().set_requires_grad(false);
    }
    Tensor x = ctx.input(f32, {4, 5}, "x");
    Tensor loss = sum(sqr(m(x)));
    Graph g = Graph::forward(loss);
    g.backward(loss);
    auto buf = allocate_tensors(ctx, cpu);
    x.set(random_values(20, 5));
    cpu.compute(g);
    got.push_back(g.grad(m.fc1.weight()).get<float>());
    EXPECT_EQ(g.grad(m.fc2.weight()).defined(), !frozen);
    EXPECT_EQ(g.grad(m.fc2.bias()).defined(), !frozen);
    EXPECT_EQ(g.grad(m.fc3.weight()).defined(), !frozen);
    EXPECT_TRUE(g.grad(m.fc3.bias()).defined());  // only fc3's weight is frozen
    size_t accumulators = 0;
    for (const TensorNode* n : g.nodes())
      accumulators += n->op == Op::ACCUMULATE || n->op == Op::MATMUL_ACC;
    EXPECT_EQ(accumulators, frozen ? 3u : 6u);
    EXPECT_EQ(m.trainable_parameters().size(), frozen ? 3u : 6u);
    EXPECT_EQ(m.parameters().size(), 6u);  // frozen params are still params
  }
  EXPECT_EQ(got[0], got[1]);
}

TEST(NnFreeze, FreezeAndUnfreezeTheTree) {
  Context ctx;
  Mlp3 m(ctx, 2, 3, 1);
  m.freeze();
  for (Tensor p : m.parameters()) EXPECT_FALSE(p.requires_grad());
  EXPECT_TRUE(m.trainable_parameters().empty());
  m.fc3.unfreeze();
  EXPECT_TRUE(m.fc3.weight().requires_grad());
  EXPECT_FALSE(m.fc1.weight().requires_grad());
  m.unfreeze();
  EXPECT_EQ(m.trainable_parameters().size(), 6u);
  // Tensors that are not params never require gradients.
  Tensor x = ctx.input(f32, {1, 2});
  EXPECT_FALSE(x.requires_grad());
  x.set_requires_grad(false);  // a no-op
  EXPECT_KILN_ERROR(x.set_requires_grad(true), "tensor", "not a param", "Context::param");
}

TEST(NnFreeze, ErrorsNameTheFrozenParams) {
  Context ctx;
  Mlp3 m(ctx, 2, 3, 1);
  m.freeze();
  Tensor x = ctx.input(f32, {4, 2}, "x");
  Tensor y = m(x);
  Tensor loss = sum(y);
  Graph g = Graph::forward(loss);
  EXPECT_KILN_ERROR(g.backward(loss), "backward", "trainable param", "frozen");

  OptConfig cfg;
  cfg.inputs = x;
  cfg.outputs = y;
  cfg.loss = LossKind::mse;
  cfg.model = &m;
  EXPECT_KILN_ERROR(OptContext{cfg}, "backward", "trainable param", "frozen");
  m.fc1.unfreeze();
  cfg.model = nullptr;
  cfg.params = {m.fc1.weight(), m.fc2.weight()};
  EXPECT_KILN_ERROR(OptContext{cfg}, "opt", "fc2.weight", "frozen");
  EXPECT_TRUE(weight_decay_groups(m, 0.1f).size() == 2);  // fc1's weight and bias only
  EXPECT_EQ(weight_decay_groups(m, 0.1f)[0].params.size(), 1u);
}

// An OptContext over a model with frozen layers: no gradients or optimizer
// state for them (less static memory, no larger a planned buffer), the frozen
// weights unchanged by steps, the trainable ones stepped as without freezing.
TEST(NnFreeze, OptContextKeepsNoStateForFrozenParams) {
  struct Run {
    size_t static_bytes = 0, plan_bytes = 0;
    std::vector<float> fc1_after, fc3_after;
    std::vector<float> fc3_before;
  };
  auto run = [](bool frozen) {
    Context ctx;
    Mlp3 m(ctx, 16, 64, 4);
    CpuBackend cpu(1);
    m.allocate(cpu);
    m.init(9);
    if (frozen) {
      m.fc2.freeze();
      m.fc3.freeze();
    }
    Tensor x = ctx.input(f32, {8, 16}, "x");
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = m(x);
    cfg.loss = LossKind::mse;
    cfg.model = &m;
    cfg.backends = {&cpu};
    cfg.schedule = schedule::constant(OptimizerParams{}.set_lr(0.01f));
    OptContext opt(cfg);
    Run r;
    r.static_bytes = opt.static_bytes();
    r.plan_bytes = opt.memory_plan().buffer_size;
    EXPECT_EQ(opt.state(m.fc1.weight()).m.defined(), true);
    EXPECT_EQ(opt.state(m.fc2.weight()).m.defined(), !frozen);  // no state when frozen
    r.fc3_before = m.fc3.weight().get<float>();
    x.set(random_values(8 * 16, 1));
    opt.labels().set(random_values(8 * 4, 2));
    opt.forward_backward();
    opt.optimizer_step();
    r.fc1_after = m.fc1.weight().get<float>();
    r.fc3_after = m.fc3.weight().get<float>();
    return r;
  };
  const Run full = run(false), frozen = run(true);
  // fc2 and fc3: (64*64 + 64) + (4*64 + 4) floats without gradient, m and v.
  const size_t frozen_floats = 64 * 64 + 64 + 4 * 64 + 4;
  EXPECT_GE(full.static_bytes - frozen.static_bytes, 3 * 4 * frozen_floats);
  // Weight gradients go straight into their accumulators (MATMUL_ACC), so
  // neither run plans temporaries for them: freezing plans no more.
  EXPECT_LE(frozen.plan_bytes, full.plan_bytes);
  EXPECT_EQ(frozen.fc3_after, frozen.fc3_before);
  EXPECT_NE(full.fc3_after, full.fc3_before);
  // fc1's step does not depend on whether the layers above train.
  EXPECT_EQ(frozen.fc1_after, full.fc1_after);
}

TEST(NnFreeze, OptimizerLeavesFrozenParamsOut) {
  Context ctx;
  Mlp3 m(ctx, 2, 3, 1);
  CpuBackend cpu(1);
  m.allocate(cpu);
  m.fc1.freeze();
  Optimizer adamw(m.parameters(), cpu);
  EXPECT_EQ(adamw.params().size(), 4u);
  m.freeze();
  EXPECT_KILN_ERROR(Optimizer(m.parameters(), cpu), "optimizer", "frozen");
}

}  // namespace
}  // namespace kiln::test
