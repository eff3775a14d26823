// GraphAllocator + CpuBackend: results are bit-for-bit the same with reuse on and
// off (so in-place never clobbers a value read later), and the tensors the user
// owns (inputs, params, outputs, gradient accumulators) keep their values.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>

#include "alloc_check.h"
#include "kiln/ext/alloc.h"

using namespace kiln;
using alloc_test::bytes_of;

namespace {

struct RunResult {
  std::vector<std::vector<uint8_t>> outputs, grads, leaves;
};

// Builds random graph `seed`, allocates it with the given reuse setting, fills the
// leaves, runs it `runs` times and reads everything the user can see.
RunResult run_random(CpuBackend& cpu, uint64_t seed, bool backward, bool reuse, int runs = 1) {
  alloc_test::RandomGraph rg = alloc_test::make_random_graph(seed, backward);
  GraphAllocator galloc(cpu.buffer_type(), {.reuse = reuse});
  galloc.alloc(rg.graph);
  EXPECT_EQ(alloc_test::check_overlaps(rg.graph, *galloc.buffer()), "") << "seed " << seed;
  alloc_test::fill_leaves(rg, seed);
  RunResult r;
  for (const Tensor& l : rg.leaves)
    if (l.has_data()) r.leaves.push_back(bytes_of(l));
  for (int i = 0; i < runs; ++i) cpu.compute(rg.graph);
  for (const Tensor& o : rg.outputs) r.outputs.push_back(bytes_of(o));
  for (const Tensor& g : rg.grads) r.grads.push_back(bytes_of(g));
  // The leaves still hold what the user wrote.
  size_t k = 0;
  for (const Tensor& l : rg.leaves)
    if (l.has_data()) {
      EXPECT_EQ(bytes_of(l), r.leaves[k++]) << "seed " << seed << " leaf " << l.name();
    }
  return r;
}

}  // namespace

TEST(GraphAllocatorCpu, RandomGraphsGiveTheSameBitsWithAndWithoutReuse) {
  CpuBackend cpu(1);  // tiny tensors: one thread avoids a barrier per node
  for (uint64_t seed = 1; seed <= 2000; ++seed) {
    const bool backward = seed % 2 == 0;
    RunResult on = run_random(cpu, seed, backward, true);
    RunResult off = run_random(cpu, seed, backward, false);
    ASSERT_EQ(on.outputs, off.outputs) << "seed " << seed;
    ASSERT_EQ(on.grads, off.grads) << "seed " << seed;
    if (HasFailure()) return;
  }
}

TEST(GraphAllocatorCpu, InPlaceIsSafeWithSeveralThreads) {
  // Threads split a kernel's work; in place, each must still read its part of
  // src0 before writing it.
  CpuBackend cpu(2);
  for (uint64_t seed = 5001; seed <= 5040; ++seed) {
    const bool backward = seed % 2 == 0;
    RunResult on = run_random(cpu, seed, backward, true);
    RunResult off = run_random(cpu, seed, backward, false);
    ASSERT_EQ(on.outputs, off.outputs) << "seed " << seed;
    ASSERT_EQ(on.grads, off.grads) << "seed " << seed;
    if (HasFailure()) return;
  }
}

TEST(GraphAllocatorCpu, GradientAccumulatorsKeepTheirValuesAcrossRuns) {
  CpuBackend cpu(1);
  int checked = 0;
  for (uint64_t seed = 2; seed <= 200 && checked < 30; seed += 2) {
    RunResult once = run_random(cpu, seed, true, false, 1);
    if (once.grads.empty()) continue;
    RunResult twice = run_random(cpu, seed, true, true, 2);
    ASSERT_EQ(once.grads.size(), twice.grads.size());
    for (size_t i = 0; i < once.grads.size(); ++i) {
      std::vector<float> a(once.grads[i].size() / 4), b(a.size());
      std::memcpy(a.data(), once.grads[i].data(), once.grads[i].size());
      std::memcpy(b.data(), twice.grads[i].data(), twice.grads[i].size());
      for (size_t j = 0; j < a.size(); ++j)  // (sqrt'(0) and friends give inf/NaN)
        if (std::isfinite(a[j])) ASSERT_EQ(2 * a[j], b[j]) << "seed " << seed;
    }
    ++checked;
  }
  EXPECT_GT(checked, 10);
}

TEST(GraphAllocatorCpu, AnMlpTrainingGraphMatchesTheSimpleAllocator) {
  // The same model allocated by allocate_tensors (no reuse) and the graph allocator.
  auto build = [](Context& ctx) {
    Tensor x = ctx.input(f32, {32, 20}, "x");
    Tensor y = ctx.input(i32, {32}, "y");
    Tensor w1 = ctx.param(f32, {20, 50}, "w1"), b1 = ctx.param(f32, {50}, "b1");
    Tensor w2 = ctx.param(f32, {50, 10}, "w2"), b2 = ctx.param(f32, {10}, "b2");
    Tensor logits = matmul(relu(matmul(x, w1) + b1), w2) + b2;
    Tensor loss = cross_entropy(logits, y);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    return std::make_tuple(g, std::vector<Tensor>{x, w1, b1, w2, b2}, y, loss,
                           std::vector<Tensor>{w1, b1, w2, b2});
  };
  auto fill = [](const std::vector<Tensor>& ts, Tensor y) {
    uint32_t state = 7;
    for (Tensor t : ts) {
      std::vector<float> v(size_t(t.numel()));
      for (float& f : v)
        f = float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f;
      t.set(v);
    }
    std::vector<int32_t> labels(32);
    for (int i = 0; i < 32; ++i) labels[size_t(i)] = (i * 7) % 10;
    y.set(labels);
  };
  CpuBackend cpu(2);
  Context c1, c2;
  auto [g1, in1, y1, loss1, p1] = build(c1);
  auto [g2, in2, y2, loss2, p2] = build(c2);
  auto simple = allocate_tensors(c1, cpu);
  GraphAllocator galloc(cpu.buffer_type());
  galloc.alloc(g2);
  EXPECT_GT(galloc.plan().n_inplace, 0u);
  EXPECT_LT(galloc.plan().buffer_size, galloc.plan().total_size);
  fill(in1, y1);
  fill(in2, y2);
  for (int step = 0; step < 3; ++step) {
    // Allocating the same graph again keeps every tensor (and accumulated
    // gradient) where it was.
    if (step == 1) {
      EXPECT_FALSE(galloc.alloc(g2));
    }
    cpu.compute(g1);
    cpu.compute(g2);
    EXPECT_EQ(bytes_of(loss1), bytes_of(loss2));
    for (size_t i = 0; i < p1.size(); ++i)
      EXPECT_EQ(bytes_of(g1.grad(p1[i])), bytes_of(g2.grad(p2[i])));
  }
}
