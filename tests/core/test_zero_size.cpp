// Zero-element tensors are valid: they get memory (has_data()
// is true), values can be set and read (none), and ops compute on them as in
// PyTorch: elementwise ops and views give empty results, a sum over an empty
// axis is 0, matmul with an empty inner dim gives zeros, max over an empty axis
// is an error.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace {

using kiln::f32;
using kiln::i32;
using kiln::Tensor;

TEST(ZeroSize, AllocateTensorsGivesEmptyTensorsMemory) {
  kiln::Context ctx;
  Tensor e = ctx.input(f32, {0, 3}, "e");
  Tensor x = ctx.input(f32, {2}, "x");
  Tensor e2 = ctx.param(f32, {4, 0}, "e2");
  kiln::CpuBackend cpu(1);
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
  EXPECT_TRUE(e.has_data());
  EXPECT_TRUE(e2.has_data());
  // Distinct places: an empty tensor never aliases a neighbour's memory.
  EXPECT_NE(e.node()->data, x.node()->data);
  e.set(std::vector<float>{});
  EXPECT_TRUE(e.get<float>().empty());
  e2.fill_zero();
  x.set({1.0f, 2.0f});
  EXPECT_EQ(x.get<float>(), (std::vector<float>{1, 2}));
}

TEST(ZeroSize, AContextOfOnlyEmptyTensorsGetsMemory) {
  kiln::Context ctx;
  Tensor e = ctx.input(f32, {0}, "e");
  kiln::CpuBackend cpu(1);
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
  EXPECT_TRUE(e.has_data());
  EXPECT_TRUE(e.get<float>().empty());
}

TEST(ZeroSize, ElementwiseViewsAndReductions) {
  kiln::Context ctx;
  Tensor e = ctx.input(f32, {0, 3}, "e");
  Tensor b = ctx.input(f32, {3}, "b");
  Tensor y = relu(e + b) * 2.0f;  // [0, 3]
  Tensor col = sum(e, 0);         // [3]: sums over nothing are 0
  Tensor all = sum(e);            // []: 0
  Tensor rows = sum(e, 1);        // [0]
  Tensor m = mean(e, 0);          // [3]: 0 / 0 is NaN, as in PyTorch
  Tensor mall = mean(e);          // []: NaN
  Tensor t = e.T().contiguous();  // [3, 0]
  Tensor r = e.reshape({3, 0});
  Tensor sm = softmax(e);  // [0, 3]
  Tensor c = ctx.input(f32, {2, 3}, "c");
  Tensor cat = kiln::concat({e, c}, 0);
  kiln::Graph g = kiln::Graph::forward({y, col, all, rows, m, mall, t, r, sm, cat});
  kiln::CpuBackend cpu(2);
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
  b.set({1.0f, 2.0f, 3.0f});
  c.set({1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f});
  // Garbage where sums go, so that "not written" cannot pass for 0.
  col.set({7.0f, 7.0f, 7.0f});
  all.set({7.0f});
  cpu.compute(g);
  EXPECT_EQ(y.numel(), 0);
  EXPECT_EQ(col.get<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(all.item(), 0.0f);
  EXPECT_TRUE(rows.get<float>().empty());
  for (float v : m.get<float>()) EXPECT_TRUE(std::isnan(v)) << v;
  EXPECT_TRUE(std::isnan(mall.item()));
  EXPECT_EQ(t.shape(), (kiln::Shape{3, 0}));
  EXPECT_TRUE(r.get<float>().empty());
  EXPECT_TRUE(sm.get<float>().empty());
  EXPECT_EQ(cat.get<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(ZeroSize, MaxAndArgmaxOverAnEmptyAxisAreErrors) {
  // PyTorch: "max(): Expected reduction dim 0 to have non-zero size".
  kiln::Context ctx;
  Tensor e = ctx.input(f32, {0, 3}, "e");
  EXPECT_KILN_ERROR((void)max(e, 0), "max", "empty", "[0, 3]");
  EXPECT_KILN_ERROR((void)max(e), "max", "empty", "[0, 3]");
  EXPECT_KILN_ERROR((void)argmax(e, 0), "argmax", "empty", "[0, 3]");
  // Over a non-empty axis the result is just empty.
  EXPECT_EQ(max(e, 1).shape(), (kiln::Shape{0}));
}

TEST(ZeroSize, MatmulWithAnEmptyInnerDimIsZero) {
  kiln::Context ctx;
  Tensor a = ctx.input(f32, {2, 0}, "a");
  Tensor b = ctx.input(f32, {0, 3}, "b");
  Tensor w = ctx.input(f32, {3, 4}, "w");
  Tensor y = matmul(a, b);                       // [2, 3] of zeros
  Tensor e = matmul(b.T().contiguous().T(), w);  // [0, 4]
  Tensor yt = matmul(b.T(), a.T());              // [3, 2] of zeros, transposed operands
  kiln::Graph g = kiln::Graph::forward({y, e, yt});
  kiln::CpuBackend cpu(2);
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
  y.set(std::vector<float>(6, 7.0f));
  yt.set(std::vector<float>(6, 7.0f));
  cpu.compute(g);
  EXPECT_EQ(y.get<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(yt.get<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(e.numel(), 0);
}

TEST(ZeroSize, GradientsThroughAnEmptyBatch) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {0, 3}, "x");
  Tensor w = ctx.param(f32, {3, 2}, "w");
  Tensor bias = ctx.param(f32, {2}, "bias");
  Tensor loss = sum(sqr(matmul(x, w) + bias));
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  kiln::CpuBackend cpu(1);
  kiln::GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g);
  EXPECT_TRUE(x.has_data());
  w.set(std::vector<float>(6, 1.0f));
  bias.set({1.0f, 2.0f});
  g.reset_grads();
  cpu.compute(g);
  EXPECT_EQ(loss.item(), 0.0f);
  EXPECT_EQ(g.grad(w).get<float>(), std::vector<float>(6, 0.0f));
  EXPECT_EQ(g.grad(bias).get<float>(), std::vector<float>(2, 0.0f));
}

}  // namespace
