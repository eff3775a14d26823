// The CUDA backend's host-side decisions, checked without a device (they run
// in CI): when a node list is run eagerly, captured or replayed, the graph
// cache's size against a transformer's CUDA splits, which MATMUL operands get
// a dense copy and in what dtype, which conv matrices cuBLAS can read in place,
// and how an axis sum adds its terms.
//
//   CudaGraphPolicy.*   GraphCache::decide / next_run / lookup (LRU, evictions)
//   CudaGemmPlan.*      gemm_read, matmul_prep, matrix_view (gemm_plan.h)
//   CudaReducePlan.*    blocked_sum vs the CPU backend's bits, axis_path
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <memory>
#include <vector>

#include "kiln/ext/sched.h"
#include "kiln/kiln.h"

#if KILN_HAVE_CUDA
#include "backends/cuda/gemm_plan.h"
#include "backends/cuda/graph_cache.h"
#include "backends/cuda/reduce_plan.h"
#include "kiln/cuda.h"
#include "kiln/nn.h"

namespace kiln::test {
namespace {

using cuda::GraphCache;
using Action = GraphCache::Action;

// ---------------------------------------------------------------- graph cache
TEST(CudaGraphPolicy, FirstRunEagerSecondCapturedLaterReplayed) {
  EXPECT_EQ(GraphCache::decide(0, false, true), Action::eager);
  EXPECT_EQ(GraphCache::decide(1, false, true), Action::capture);
  EXPECT_EQ(GraphCache::decide(1, true, true), Action::replay);
  EXPECT_EQ(GraphCache::decide(7, true, true), Action::replay);
  EXPECT_EQ(GraphCache::decide(3, false, false), Action::eager);  // its capture failed

  // next_run decides before it counts the run: the first run of a list is eager.
  GraphCache::Entry e;
  EXPECT_EQ(GraphCache::next_run(e), Action::eager);
  EXPECT_EQ(e.runs, 1);
  EXPECT_EQ(GraphCache::next_run(e), Action::capture);
  e.capturable = false;  // what a failed capture leaves
  EXPECT_EQ(GraphCache::next_run(e), Action::eager);
}

// A step of `lists` node lists, run `steps` times in the same order through a
// cache of `capacity`: how many runs found their list already seen (the ones
// that capture or replay on a device).
struct CycleResult {
  int warm = 0;
  int64_t evictions = 0;
};
CycleResult run_cycle(size_t capacity, int lists, int steps) {
  GraphCache cache(capacity);
  CycleResult r;
  for (int s = 0; s < steps; ++s)
    for (int l = 0; l < lists; ++l) {
      GraphCache::Entry& e = cache.lookup({int64_t(l), 42});
      if (GraphCache::next_run(e) != Action::eager) ++r.warm;
    }
  EXPECT_LE(cache.size(), capacity);
  r.evictions = cache.evictions();
  return r;
}

TEST(CudaGraphPolicy, LruKeepsEveryListOfAStepThatFits) {
  const CycleResult fits = run_cycle(40, 40, 5);
  EXPECT_EQ(fits.warm, 40 * 4);  // every run after the first step
  EXPECT_EQ(fits.evictions, 0);
  // One list more than the cache holds: LRU drops each list just before it
  // comes back, so nothing is ever warm (why the cache must exceed a step's splits).
  const CycleResult thrash = run_cycle(40, 41, 5);
  EXPECT_EQ(thrash.warm, 0);
  EXPECT_EQ(thrash.evictions, 41 * 5 - 40);
  // Recently used lists survive one-off lists (e.g. evaluation batches).
  GraphCache cache(3);
  cache.lookup({1}).runs = 1;
  cache.lookup({2}).runs = 1;
  cache.lookup({1});
  cache.lookup({3});
  cache.lookup({4});  // drops {2}, the least recently used
  EXPECT_EQ(cache.lookup({1}).runs, 1);
  EXPECT_EQ(cache.lookup({2}).runs, 0);  // new again
  EXPECT_EQ(GraphCache(0).capacity(), 1u);
}

// A backend that claims what CudaBackend runs, in host memory: the scheduler's
// splits of a graph as they would be with a GPU (only alloc() is used).
// `without`: ops it refuses besides, as if they had no CUDA kernel.
class CudaShaped : public Backend {
 public:
  const char* name() const override { return "cuda-shaped"; }
  BufferType& buffer_type() override { return cpu.buffer_type(); }
  bool supports_op(const TensorNode* n) const override {
    return CudaBackend::supports(n) &&
           std::find(without.begin(), without.end(), n->op) == without.end();
  }
  std::vector<Op> without;
  using Backend::compute;
  void compute(std::span<TensorNode* const>) override { FAIL() << "not for running"; }
  void synchronize() override {}
  CpuBackend cpu{1};
};

// A 12-layer GPT (GPT-2 small's depth) training graph whose LayerNorms,
// attention and loss run on the CPU, as ops without a CUDA kernel would (they
// had none until the device session; a user's new op may not), so the CUDA
// part is many node lists per step. The default cache must hold them all, or
// no step would ever replay.
TEST(CudaGraphPolicy, DefaultCacheHoldsTheCudaSplitsOfAGptStep) {
  Context ctx;
  const int64_t B = 2, T = 8, D = 16, V = 32, layers = 12;
  Tensor tokens = ctx.input(i32, {B, T}, "tokens"), targets = ctx.input(i32, {B * T}, "targets");
  nn::Embedding wte(ctx, V, D);
  std::vector<std::unique_ptr<nn::TransformerBlock>> blocks;
  Tensor x = wte.forward(tokens);
  for (int64_t l = 0; l < layers; ++l) {
    blocks.push_back(std::make_unique<nn::TransformerBlock>(ctx, D, 2));
    x = blocks.back()->forward(x);
  }
  nn::LayerNorm ln_f(ctx, D);
  nn::Linear head(ctx, D, V, false);
  Tensor loss = cross_entropy(head.forward(ln_f.forward(x)).reshape({B * T, V}), targets);
  Graph g = Graph::forward(loss);
  g.backward(loss);

  CudaShaped gpu;
  gpu.without = {Op::LAYER_NORM,     Op::LAYER_NORM_BACK, Op::LAYER_NORM_BACK_AFFINE, Op::ATTENTION,
                 Op::ATTENTION_BACK, Op::CROSS_ENTROPY,   Op::CROSS_ENTROPY_BACK};
  CpuBackend cpu(1);
  Scheduler s({&gpu, &cpu});
  s.alloc(g);
  size_t cuda_splits = 0;
  for (const SplitInfo& sp : s.splits()) cuda_splits += sp.backend == 0;
  std::cout << "12-layer GPT forward+backward: " << s.n_splits() << " splits, " << cuda_splits
            << " on CUDA; graph cache holds " << CudaOptions{}.max_graphs << "\n";
  EXPECT_GT(cuda_splits, 0u);
  // + the optimizer step's list, with room for an evaluation graph's lists.
  EXPECT_LE(2 * cuda_splits + 1, size_t(CudaOptions{}.max_graphs));
  EXPECT_EQ(size_t(CudaOptions{}.max_graphs), GraphCache::kDefaultCapacity);
}

// ---------------------------------------------------------------- GEMM operands
TEST(CudaGemmPlan, GemmReadTakesUnitStrideLayoutsOnly) {
  cuda::GemmRead r;
  ASSERT_TRUE(cuda::gemm_read(4, 8, 8, 1, &r));  // row-major
  EXPECT_FALSE(r.transpose);
  EXPECT_EQ(r.ld, 8);
  ASSERT_TRUE(cuda::gemm_read(4, 8, 1, 4, &r));  // x.T() of an [8, 4]
  EXPECT_TRUE(r.transpose);
  EXPECT_EQ(r.ld, 4);
  ASSERT_TRUE(cuda::gemm_read(1, 8, 0, 1, &r));  // one row: its stride is never used
  EXPECT_EQ(r.ld, 8);
  EXPECT_FALSE(cuda::gemm_read(4, 8, 16, 2, &r));  // no unit stride
  EXPECT_FALSE(cuda::gemm_read(4, 8, 0, 1, &r));   // broadcast rows: ld 0
  EXPECT_FALSE(cuda::gemm_read(4, 8, 4, 1, &r));   // rows overlap: ld below the row length
  EXPECT_FALSE(cuda::gemm_read(4, 1, 0, 1, &r));   // a broadcast column
}

// Every dtype pair and readability: afterwards both operands have one dtype
// and readable layouts, and nothing readable of the shared dtype is copied.
// A batched operand whose batch dims cuBLAS cannot step with one stride gets a
// dense copy (one call), unless a dim is a broadcast (the loop keeps memory).
TEST(CudaGemmPlan, BatchDimsOfOneRunOnly) {
  const int64_t heads[] = {64, 6, 256, 64};
  const int64_t dense[] = {98304, 16384, 64, 1};
  EXPECT_TRUE(cuda::batch_dims_one_run(4, heads, dense));
  const int64_t qkv_view[] = {294912, 64, 1152, 1};  // a head view of [64, 256, 1152]
  EXPECT_FALSE(cuda::batch_dims_one_run(4, heads, qkv_view));
  const int64_t broadcast[] = {0, 16384, 64, 1};
  EXPECT_TRUE(cuda::batch_dims_one_run(4, heads, broadcast));
  const int64_t one_head[] = {64, 1, 256, 64};
  const int64_t odd[] = {294912, 7, 1152, 1};  // the size-1 dim's stride does not matter
  EXPECT_TRUE(cuda::batch_dims_one_run(4, one_head, odd));
  const int64_t three[] = {8, 256, 64};
  const int64_t any[] = {123456, 64, 1};
  EXPECT_TRUE(cuda::batch_dims_one_run(3, three, any));
  EXPECT_TRUE(cuda::batch_dims_one_run(2, three + 1, any + 1));
  const int64_t small[] = {2, 3, 4, 5}, gap[] = {100, 20, 5, 1};
  EXPECT_FALSE(cuda::batch_dims_one_run(4, small, gap));
}

TEST(CudaGemmPlan, MatmulPrepAllDtypeAndLayoutCombinations) {
  using cuda::Prep;
  const DType types[] = {f32, f16, bf16};
  for (DType ta : types)
    for (DType tb : types)
      for (int ra = 0; ra < 2; ++ra)
        for (int rb = 0; rb < 2; ++rb) {
          const cuda::MatmulPrep p = cuda::matmul_prep(ta, ra, tb, rb);
          const std::string what = std::string(dtype_name(ta)) + (ra ? "" : " (unreadable)") +
                                   " x " + dtype_name(tb) + (rb ? "" : " (unreadable)");
          EXPECT_EQ(cuda::prepared_dtype(ta, p.a), cuda::prepared_dtype(tb, p.b)) << what;
          EXPECT_TRUE(ra || p.a != Prep::none) << what << ": a not readable as it lies";
          EXPECT_TRUE(rb || p.b != Prep::none) << what << ": b not readable as it lies";
          if (ta == tb) {  // no conversion: f16 x f16 stays on f16 tensor cores
            EXPECT_NE(p.a, Prep::to_f32) << what;
            EXPECT_NE(p.b, Prep::to_f32) << what;
            EXPECT_EQ(p.a == Prep::none, bool(ra)) << what;
            EXPECT_EQ(p.b == Prep::none, bool(rb)) << what;
          } else {  // mixed: f32 for both, a readable f32 operand read in place
            EXPECT_EQ(cuda::prepared_dtype(ta, p.a), f32) << what;
            if (ta == f32) EXPECT_EQ(p.a == Prep::none, bool(ra)) << what;
            if (tb == f32) EXPECT_EQ(p.b == Prep::none, bool(rb)) << what;
          }
        }
}

// Permuted f16 and f32 operands, as views of real graphs lay them out.
TEST(CudaGemmPlan, MatmulPrepOnViews) {
  Context ctx;
  Tensor a16 = ctx.tensor(f16, {6, 4, 5}), b16 = ctx.tensor(f16, {4, 6, 3});
  Tensor a32 = ctx.tensor(f32, {4, 6, 5});
  auto readable = [](Tensor t) {
    const TensorNode* n = t.node();
    const int nd = n->shape.ndim();
    const int64_t es = int64_t(n->elem_size());
    return cuda::gemm_layout_readable(n->shape[nd - 2], n->shape[nd - 1],
                                      n->stride[size_t(nd - 2)] / es,
                                      n->stride[size_t(nd - 1)] / es);
  };
  // [4, 5, 6] with strides (5, 1, 20) elements: readable (transposed).
  Tensor p = a16.permute({1, 2, 0});
  EXPECT_TRUE(readable(p));
  // [5, 4, 6]: last two dims with strides (20, 5): no unit stride.
  Tensor q = a16.permute({2, 1, 0});
  EXPECT_FALSE(readable(q));
  cuda::MatmulPrep m = cuda::matmul_prep(f16, readable(q), f16, readable(b16));
  EXPECT_EQ(m.a, cuda::Prep::dense);  // was: an f32 copy next to an f16 b
  EXPECT_EQ(m.b, cuda::Prep::none);
  Tensor r = a32.permute({0, 2, 1}).narrow(1, 0, 2);  // f32, readable
  EXPECT_TRUE(readable(r));
  Tensor bad32 = a32.permute({2, 1, 0});  // f32 [5, 6, 4], strides (1, 5, 30): none in the last two
  EXPECT_FALSE(readable(bad32));
  m = cuda::matmul_prep(f32, readable(bad32), f16, true);
  EXPECT_EQ(m.a, cuda::Prep::dense);  // was: left as it lies ("layout not readable")
  EXPECT_EQ(m.b, cuda::Prep::to_f32);
}

// conv's GEMM matrices: in place when cuBLAS can read them, else a copy.
TEST(CudaGemmPlan, MatrixViewRefusesZeroRowStrides) {
  auto view = [](Tensor t, int rd, cuda::MatrixView* v) {
    const TensorNode* n = t.node();
    int64_t shape[kMaxDims] = {};
    for (int d = 0; d < n->shape.ndim(); ++d) shape[d] = n->shape[d];
    return cuda::matrix_view(n->dtype, n->shape.ndim(), shape, n->stride.data(), rd, v);
  };
  Context ctx;
  cuda::MatrixView v;
  Tensor w = ctx.tensor(f32, {8, 3, 3, 3});
  ASSERT_TRUE(view(w, 0, &v));
  EXPECT_EQ(v.rows, 8);
  EXPECT_EQ(v.cols, 27);
  EXPECT_EQ(v.rs, 27);
  Tensor dy = ctx.tensor(f32, {2, 8, 5, 5});
  ASSERT_TRUE(view(dy, 1, &v));
  EXPECT_EQ(v.rs, 25);
  EXPECT_EQ(v.bs, 200);
  // The gradient of sum(conv2d(x, w), 1): dy broadcast along the channels.
  Tensor g1 = ctx.tensor(f32, {2, 1, 5, 5}).expand({2, 8, 5, 5});
  EXPECT_FALSE(view(g1, 1, &v)) << "row stride 0: cuBLAS's leading dimension would be 0";
  // A 1x1 output whose gradient is a broadcast scalar (sum of the whole output).
  Tensor g2 = ctx.tensor(f32, {1, 1, 1, 1}).expand({2, 8, 1, 1});
  EXPECT_FALSE(view(g2, 1, &v));
  Tensor g3 = ctx.tensor(f32, {2, 8, 1, 1});  // a real 1x1 output: fine
  ASSERT_TRUE(view(g3, 1, &v));
  EXPECT_EQ(v.cols, 1);
  EXPECT_FALSE(view(ctx.tensor(f16, {8, 3}), 0, &v));                              // not f32
  EXPECT_FALSE(view(ctx.tensor(f32, {8, 3, 3, 3}).permute({0, 1, 3, 2}), 0, &v));  // no merge
}

// ---------------------------------------------------------------- reductions
// The thread path's sum of a strided axis gives the CPU backend's bits, and a
// long axis stays accurate (a running sum of 1M terms would not).
TEST(CudaReducePlan, BlockedSumIsTheCpuAxisSum) {
  const int64_t len = 1 << 20, cols = 3;
  Context ctx;
  Tensor x = ctx.input(f32, {len, cols});
  Tensor s0 = sum(x, 0);
  Graph g = Graph::forward(s0);
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  std::vector<float> v(size_t(len * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.1f + 0.01f * float(i % 7);
  x.set(v);
  cpu.compute(g);
  const std::vector<float> want = s0.get<float>();
  for (int64_t c = 0; c < cols; ++c) {
    const float got = cuda::blocked_sum(len, [&](int64_t k) { return v[size_t(k * cols + c)]; });
    EXPECT_EQ(std::memcmp(&got, &want[size_t(c)], 4), 0) << got << " vs " << want[size_t(c)];
    double exact = 0;
    float running = 0;
    for (int64_t k = 0; k < len; ++k) {
      exact += double(v[size_t(k * cols + c)]);
      running += v[size_t(k * cols + c)];
    }
    EXPECT_NEAR(got, exact, 1e-5 * exact);
    EXPECT_GT(std::fabs(running - exact), 1e-4 * exact) << "the test's data no longer shows drift";
  }
  EXPECT_EQ(cuda::blocked_sum(0, [](int64_t) { return 1.0f; }), 0.0f);
}

TEST(CudaReducePlan, AxisPathByShapeAndLayout) {
  using cuda::AxisPath;
  EXPECT_EQ(cuda::axis_path(100, 10, 4, 4), AxisPath::thread);       // short axis
  EXPECT_EQ(cuda::axis_path(1 << 20, 3, 12, 4), AxisPath::block);    // long axis, few outputs
  EXPECT_EQ(cuda::axis_path(4096, 1 << 16, 4, 4), AxisPath::block);  // long contiguous rows
  EXPECT_EQ(cuda::axis_path(4096, 1 << 16, 1 << 18, 4), AxisPath::thread);  // long columns
}

}  // namespace
}  // namespace kiln::test

#endif
