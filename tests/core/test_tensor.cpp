// Shapes, views (strides without copies), data access and dtype conversion.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

using namespace kiln;

TEST(Tensor, ShapesAreOutermostFirstWithByteStrides) {
  Context ctx;
  Tensor x = ctx.input(f32, {2, 3, 4});
  EXPECT_EQ(x.shape(), Shape({2, 3, 4}));
  EXPECT_EQ(x.node()->stride[0], 48);
  EXPECT_EQ(x.node()->stride[2], 4);
  EXPECT_EQ(x.size(-1), 4);
  EXPECT_THROW(ctx.input(f32, {1, 2, 3, 4, 5}), Error);
}

TEST(Tensor, ViewsShareMemoryAndReadThroughStrides) {
  Context ctx;
  Tensor x = ctx.input(f32, {2, 3});
  Tensor t = x.T();                // [3, 2]
  Tensor row = x.narrow(0, 1, 1);  // [1, 3]
  Tensor col = x.narrow(1, 2, 1);  // [2, 1]
  Tensor wide = x.narrow(0, 0, 1).expand({4, 3});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  x.set<float>({0, 1, 2, 3, 4, 5});
  EXPECT_EQ(t.node()->data, x.node()->data);
  EXPECT_FALSE(t.node()->is_contiguous());
  EXPECT_EQ(t.get<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_EQ(row.get<float>(), (std::vector<float>{3, 4, 5}));
  EXPECT_EQ(col.get<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(wide.get<float>(), (std::vector<float>{0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2}));
  // Writing through a view writes the source.
  col.set<float>({20, 50});
  EXPECT_EQ(x.get<float>(), (std::vector<float>{0, 1, 20, 3, 4, 50}));
}

TEST(Tensor, ContiguousAndReshapeCopyOnlyWhenNeeded) {
  Context ctx;
  Tensor x = ctx.input(f32, {2, 3});
  EXPECT_EQ(x.contiguous(), x);
  EXPECT_EQ(x.reshape({3, 2}).op(), Op::RESHAPE);
  Tensor tc = x.T().contiguous();
  EXPECT_EQ(tc.op(), Op::COPY);
  Tensor flat = x.T().reshape({6});  // copies, then views
  Graph g = Graph::forward(flat);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  x.set<float>({0, 1, 2, 3, 4, 5});
  cpu.compute(g);
  EXPECT_EQ(flat.get<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW(x.T().view({6}), Error);
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f)), 1.0f);
  EXPECT_EQ(f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(f32_to_f16(0.1f), 0x2e66);
  EXPECT_EQ(f32_to_f16(6e-8f), 0x0001);     // subnormal
  EXPECT_EQ(f32_to_f16(2.98e-8f), 0x0000);  // below half the smallest subnormal
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(NAN))));
  for (uint32_t h = 0; h < 0x7c00; ++h) EXPECT_EQ(f32_to_f16(f16_to_f32(uint16_t(h))), h);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.5f)), 1.5f);
  EXPECT_EQ(f32_to_bf16(1.00390625f), 0x3f80);  // tie rounds to even

  Context ctx;
  Tensor x = ctx.input(f32, {4});
  Tensor h = x.to(f16), b = x.to(bf16), i = x.to(i32);
  Tensor back = h.to(f32);
  Graph g = Graph::forward({back, b, i});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  x.set<float>({1.0f, -2.5f, 0.1f, 3.75f});
  cpu.compute(g);
  EXPECT_EQ(h.get<uint16_t>()[2], 0x2e66);
  EXPECT_EQ(back.get<float>()[1], -2.5f);
  EXPECT_EQ(b.get<uint16_t>()[0], f32_to_bf16(1.0f));
  EXPECT_EQ(i.get<int32_t>(), (std::vector<int32_t>{1, -2, 0, 3}));
}

TEST(Tensor, DataAccessChecksDtypeSizeAndMemory) {
  Context ctx;
  Tensor x = ctx.input(f32, {3}, "x");
  EXPECT_THROW(x.set<float>({1, 2, 3}), Error);  // no memory yet
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  EXPECT_THROW(x.set<float>({1, 2}), Error);
  EXPECT_THROW(x.set<int32_t>({1, 2, 3}), Error);
  x.set<float>({1, 2, 3});
  EXPECT_EQ(x.get<float>(), (std::vector<float>{1, 2, 3}));
}
