// The API cannot be used after free. A Tensor or Graph whose
// Context is gone throws kiln::Error instead of reading freed metadata; a buffer
// that dies detaches the tensors placed in it (has_data() becomes false) and
// computing on them throws instead of reading freed memory. These tests are also
// run under ASan (the asan preset), where any use-after-free is reported.
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace {

using kiln::f32;
using kiln::Tensor;

TEST(Lifetime, TensorAfterItsContextIsDestroyedThrows) {
  Tensor x, y;
  {
    kiln::Context ctx;
    x = ctx.input(f32, {2, 3}, "x");
    y = relu(x);
  }
  EXPECT_TRUE(x.defined());  // the handle itself is still set
  EXPECT_KILN_ERROR((void)x.shape().str(), "tensor", "Context", "destroyed");
  EXPECT_KILN_ERROR((void)x.dtype(), "tensor", "destroyed");
  EXPECT_KILN_ERROR((void)x.has_data(), "tensor", "destroyed");
  EXPECT_KILN_ERROR((void)relu(x), "tensor", "destroyed");
  EXPECT_KILN_ERROR((void)(x + y), "tensor", "destroyed");
  EXPECT_KILN_ERROR((void)x.reshape({3, 2}), "tensor", "destroyed");
  EXPECT_KILN_ERROR((void)kiln::Graph::forward(y), "tensor", "destroyed");
  // Copies of a dead handle are dead too; an undefined handle stays harmless.
  Tensor z = y;
  EXPECT_KILN_ERROR((void)z.numel(), "tensor", "destroyed");
  Tensor none;
  EXPECT_FALSE(none.defined());
}

TEST(Lifetime, GraphAfterItsContextIsDestroyedThrows) {
  kiln::Graph g;
  kiln::CpuBackend cpu(1);
  {
    kiln::Context ctx;
    Tensor x = ctx.input(f32, {4}, "x");
    g = kiln::Graph::forward(sum(relu(x)));
  }
  EXPECT_KILN_ERROR(cpu.compute(g), "graph", "Context", "destroyed");
  EXPECT_KILN_ERROR((void)g.nodes(), "graph", "destroyed");
  EXPECT_KILN_ERROR((void)g.dump(), "graph", "destroyed");
}

// The case that once read freed memory: the buffer from allocate_tensors dies, the graph runs
// again.
TEST(Lifetime, ComputeAfterTheBufferIsDestroyedThrows) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {64, 64}, "x");
  Tensor w = ctx.param(f32, {64, 64}, "w");
  Tensor y = matmul(x, w);
  Tensor xt = x.T();
  kiln::Graph g = kiln::Graph::forward(y);
  kiln::CpuBackend cpu(1);
  {
    std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
    x.set(std::vector<float>(64 * 64, 1.0f));
    w.set(std::vector<float>(64 * 64, 0.5f));
    cpu.compute(g);
    EXPECT_EQ(y.get<float>()[0], 32.0f);
  }
  // Detached: no tensor (views included) points into the freed memory.
  for (Tensor t : {x, w, y, xt}) {
    EXPECT_FALSE(t.has_data());
    EXPECT_EQ(t.node()->buffer, nullptr);
  }
  EXPECT_KILN_ERROR(cpu.compute(g), "compute", "'x'", "no memory");
  // Running the node list directly (as the scheduler does) checks every node.
  EXPECT_KILN_ERROR(cpu.compute(std::span<kiln::TensorNode* const>(g.nodes())), "compute",
                    "no memory");
  EXPECT_KILN_ERROR((void)y.get<float>(), "get", "no memory");
  EXPECT_KILN_ERROR(x.set(std::vector<float>(64 * 64, 1.0f)), "set", "no memory");

  // Allocating again makes the same graph usable.
  std::unique_ptr<kiln::Buffer> buf = kiln::allocate_tensors(ctx, cpu);
  EXPECT_TRUE(xt.has_data());
  x.set(std::vector<float>(64 * 64, 2.0f));
  w.set(std::vector<float>(64 * 64, 0.5f));
  cpu.compute(g);
  EXPECT_EQ(y.get<float>()[0], 64.0f);
}

TEST(Lifetime, BufferOutlivingItsContextIsSafeToDestroy) {
  std::unique_ptr<kiln::Buffer> buf;
  kiln::CpuBackend cpu(1);
  {
    kiln::Context ctx;
    Tensor x = ctx.input(f32, {8}, "x");
    (void)relu(x);
    buf = kiln::allocate_tensors(ctx, cpu);
  }
  buf.reset();  // must not touch the dead context's tensors (ASan checks)
  SUCCEED();
}

TEST(Lifetime, GraphAllocatorGrowthDetachesTheOldBuffersTensors) {
  kiln::Context ctx;
  Tensor a = ctx.input(f32, {16}, "a");
  Tensor small = relu(a);
  Tensor b = ctx.input(f32, {4096}, "b");
  Tensor big = relu(b);
  kiln::GraphAllocator galloc(kiln::host_buffer_type());
  kiln::Graph g1 = kiln::Graph::forward(small), g2 = kiln::Graph::forward(big);
  galloc.alloc(g1);
  EXPECT_TRUE(small.has_data());
  EXPECT_TRUE(galloc.alloc(g2));  // the buffer grows: the old one is freed
  // g1's tensors lived in the freed buffer: they lost their memory explicitly.
  EXPECT_FALSE(a.has_data());
  EXPECT_FALSE(small.has_data());
  kiln::CpuBackend cpu(1);
  EXPECT_KILN_ERROR(cpu.compute(g1), "compute", "no memory");
  EXPECT_TRUE(big.has_data());
  b.set(std::vector<float>(4096, -1.0f));
  cpu.compute(g2);
  EXPECT_EQ(big.get<float>()[7], 0.0f);
}

}  // namespace
