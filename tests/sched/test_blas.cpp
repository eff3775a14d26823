// The BLAS backend (built with OpenBLAS only): sgemm on every layout matmul
// produces, alone and scheduled with the CPU backend on training graphs.
//
// Tolerance: sgemm sums in another order than kiln's GEMM, so results differ
// in the last bits; we require max|a-b| <= 1e-5 * max|a| per tensor.
#include "kiln/ext/alloc.h"
#include "kiln/ext/sched.h"
#include "kiln/registry.h"
#include "sched_test_util.h"

#if KILN_HAVE_BLAS
#include "kiln/blas.h"

using namespace kiln;
using namespace sched_test;

namespace {

constexpr double kTol = 1e-5;

std::vector<float> ramp(int64_t n, float scale, int seed) {
  std::vector<float> v(size_t(n), 0.0f);
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = scale * float(((i * 37 + seed * 11) % 23) - 11) / 11.0f;
  return v;
}

// One matmul case: builds `make(ctx)` (leaves x, y), runs it on the CPU and on
// BLAS (+ CPU for what BLAS does not take), compares, and reports whether
// sgemm ran it.
template <class Make>
bool check_matmul(Make make, const char* what) {
  std::vector<float> out[2];
  bool on_blas = false;
  for (int k = 0; k < 2; ++k) {
    Context ctx;
    auto [x, y, z] = make(ctx);
    Graph g = Graph::forward(z);
    CpuBackend cpu(1);
    BlasBackend blas(1);
    std::vector<Backend*> list =
        k == 0 ? std::vector<Backend*>{&cpu} : std::vector<Backend*>{&blas, &cpu};
    Scheduler s(list);
    s.alloc(g);
    x.set(ramp(x.node()->view_src ? x.node()->view_src->numel() : x.numel(), 1.0f, 1));
    y.set(ramp(y.numel(), 0.5f, 2));
    s.compute(g);
    out[k] = values(z);
    if (k == 1) on_blas = s.backend_of(z) == &blas;
  }
  EXPECT_LE(rel_diff(out[0], out[1]), kTol) << what;
  EXPECT_GT(rel_diff(out[0], std::vector<float>(out[0].size(), 0.0f)), 0.5)
      << what << ": all zero?";
  return on_blas;
}

}  // namespace

TEST(Blas, SgemmTakesEveryLayoutMatmulsProduce) {
  using T3 = std::tuple<Tensor, Tensor, Tensor>;
  // Plain row-major.
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {7, 5}), b = c.input(f32, {5, 3});
        return T3{a, b, matmul(a, b)};
      },
      "plain"));
  // a.T() @ b and a @ b.T(): the products of matmul's backward.
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {5, 7}), b = c.input(f32, {5, 3});
        return T3{a, b, matmul(a.T(), b)};
      },
      "a.T() @ b"));
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {7, 5}), b = c.input(f32, {3, 5});
        return T3{a, b, matmul(a, b.T())};
      },
      "a @ b.T()"));
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {5, 7}), b = c.input(f32, {3, 5});
        return T3{a, b, matmul(a.T(), b.T())};
      },
      "a.T() @ b.T()"));
  // Batched, with broadcast batch dims (one operand 2-D, or size-1 batch).
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {2, 3, 4, 5}), b = c.input(f32, {5, 6});
        return T3{a, b, matmul(a, b)};
      },
      "batched @ 2-D"));
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {1, 4, 5}), b = c.input(f32, {3, 6, 5});
        return T3{a, b, matmul(a, b.transpose(-2, -1))};
      },
      "broadcast batch @ transposed batch"));
  // A column slice: rows longer than K (lda > K).
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {4, 9}), b = c.input(f32, {5, 3});
        return T3{a, b, matmul(a.narrow(1, 2, 5), b)};
      },
      "narrowed a"));
  // Vectors: M = 1, N = 1.
  EXPECT_TRUE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {1, 8}), b = c.input(f32, {8, 1});
        return T3{a, b, matmul(a, b)};
      },
      "1x8 @ 8x1"));
  // Broadcast rows (stride 0) cannot be described to sgemm: the CPU runs it.
  EXPECT_FALSE(check_matmul(
      [](Context& c) {
        Tensor a = c.input(f32, {1, 5}), b = c.input(f32, {5, 3});
        return T3{a, b, matmul(a.expand({4, 5}), b)};
      },
      "expanded rows"));
}

TEST(Blas, ResultsDoNotDependOnTheThreadCount) {
  // Pool mode hands each thread a slice of C: the bits must not change.
  auto run = [](int threads, BlasThreads mode, bool ta, bool tb) {
    Context c;
    const int64_t M = 200, K = 150, N = 120;
    Tensor a = c.input(f32, ta ? Shape{K, M} : Shape{M, K}),
           b = c.input(f32, tb ? Shape{N, K} : Shape{K, N});
    Tensor z = matmul(ta ? a.T() : a, tb ? b.T() : b);
    Graph g = Graph::forward(z);
    BlasBackend blas(threads, false, mode);
    GraphAllocator galloc(blas.buffer_type());
    galloc.alloc(g);
    a.set(ramp(a.numel(), 1.0f, 3));
    b.set(ramp(b.numel(), 0.25f, 4));
    blas.compute(g);
    return values(z);
  };
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      const std::vector<float> one = run(1, BlasThreads::pool, ta, tb);
      EXPECT_EQ(one, run(2, BlasThreads::pool, ta, tb)) << ta << tb;
      EXPECT_EQ(one, run(3, BlasThreads::pool, ta, tb)) << ta << tb;
      EXPECT_LE(rel_diff(one, run(2, BlasThreads::openblas, ta, tb)), kTol) << ta << tb;
    }
}

TEST(Blas, SupportsOnlyF32Matmul) {
  Context c;
  Tensor a = c.input(f32, {4, 5}), b = c.input(f32, {5, 3}), h = c.input(f16, {4, 5});
  BlasBackend blas(1);
  EXPECT_TRUE(blas.supports_op(matmul(a, b).node()));
  EXPECT_FALSE(blas.supports_op(matmul(h, b).node()));
  EXPECT_FALSE(blas.supports_op(relu(a).node()));
  EXPECT_TRUE(blas.supports_op(a.T().node()));  // views need no kernel
  BlasBackend both(1, /*cpu_kernels=*/true);
  EXPECT_TRUE(both.supports_op(relu(a).node()));
  EXPECT_TRUE(both.supports_op(matmul(h, b).node()));
}

TEST(Blas, AloneItRejectsOtherOpsClearly) {
  Context c;
  Tensor a = c.input(f32, {4, 5}), b = c.input(f32, {5, 3});
  Tensor z = relu(matmul(a, b));
  Graph g = Graph::forward(z);
  BlasBackend blas(1);
  GraphAllocator galloc(blas.buffer_type());
  galloc.alloc(g);
  try {
    blas.compute(g);
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[blas] node #"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("(relu f32[4, 3])"), std::string::npos) << e.what();
  }
}

TEST(Blas, SchedulesMlpTrainingLikeTheCpu) {
  // Forward and backward: every matmul (x @ w, h.T() @ dz, dz @ w.T()) on BLAS,
  // no copies (both use host memory), results within kTol of the CPU.
  Model ref = make_mlp(32, 100, 64, 10), m = make_mlp(32, 100, 64, 10);
  CpuBackend cpu(2);
  BlasBackend blas(2);
  Scheduler only_cpu({&cpu}), both({&blas, &cpu});
  only_cpu.alloc(ref.graph);
  both.alloc(m.graph);
  fill(ref, 1);
  fill(m, 1);
  for (int i = 0; i < 2; ++i) {  // gradients accumulate over two runs
    only_cpu.compute(ref.graph);
    both.compute(m.graph);
  }
  int matmuls = 0;
  for (const TensorNode* n : m.graph.nodes())
    if (n->op == Op::MATMUL || n->op == Op::MATMUL_ACC) {
      ++matmuls;
      EXPECT_EQ(both.backend_of(n), &blas) << both.dump();
    }
  // 2 forward, 3 backward (x needs no gradient; the 2 weight gradients are
  // MATMUL_ACC, sgemm with beta 1 into the accumulators).
  EXPECT_EQ(matmuls, 5);
  EXPECT_EQ(both.n_copies(), 0u);
  EXPECT_GE(both.n_splits(), 3u);
  EXPECT_LE(rel_diff(values(ref.loss), values(m.loss)), kTol);
  EXPECT_LE(rel_diff(values(ref.logits), values(m.logits)), kTol);
  std::vector<Tensor> gr = ref.grads(), gm = m.grads();
  for (size_t i = 0; i < gr.size(); ++i)
    EXPECT_LE(rel_diff(values(gr[i]), values(gm[i])), kTol) << "grad " << i;
}

TEST(Blas, SchedulesCnnTrainingLikeTheCpu) {
  Model ref = make_cnn(4, 2, 8, 5), m = make_cnn(4, 2, 8, 5);
  CpuBackend cpu(2);
  BlasBackend blas(2);
  Scheduler only_cpu({&cpu}), both({&blas, &cpu});
  only_cpu.alloc(ref.graph);
  both.alloc(m.graph);
  fill(ref, 2);
  fill(m, 2);
  only_cpu.compute(ref.graph);
  both.compute(m.graph);
  int on_blas = 0;
  for (const TensorNode* n : m.graph.nodes())
    on_blas += both.backend_of(n) == &blas && (n->op == Op::MATMUL || n->op == Op::MATMUL_ACC);
  // The dense layer's forward, d input and d weight products (the convolutions
  // are CONV2D nodes, which only the CPU backend runs).
  EXPECT_EQ(on_blas, 3) << both.dump();
  EXPECT_LE(rel_diff(values(ref.loss), values(m.loss)), kTol);
  std::vector<Tensor> gr = ref.grads(), gm = m.grads();
  for (size_t i = 0; i < gr.size(); ++i)
    EXPECT_LE(rel_diff(values(gr[i]), values(gm[i])), kTol) << "grad " << i;
}

TEST(Blas, TheRegistryBackendRunsWholeGraphsAlone) {
  // make_backend("blas"): sgemm plus CPU kernels, no scheduler needed.
  Model ref = make_mlp(8, 12, 16, 4), m = make_mlp(8, 12, 16, 4);
  CpuBackend cpu(1);
  std::unique_ptr<Backend> blas = make_backend("blas", {.n_threads = 1});
  GraphAllocator ga(cpu.buffer_type()), gb(blas->buffer_type());
  ga.alloc(ref.graph);
  gb.alloc(m.graph);
  fill(ref, 3);
  fill(m, 3);
  cpu.compute(ref.graph);
  blas->compute(m.graph);
  EXPECT_LE(rel_diff(values(ref.loss), values(m.loss)), kTol);
  std::vector<Tensor> gr = ref.grads(), gm = m.grads();
  for (size_t i = 0; i < gr.size(); ++i)
    EXPECT_LE(rel_diff(values(gr[i]), values(gm[i])), kTol) << "grad " << i;
}

#endif  // KILN_HAVE_BLAS
