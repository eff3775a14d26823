// One MNIST-layer-sized training step through the scheduler: BLAS (sgemm for the
// matmuls) + CPU (everything else) vs the CPU backend alone, 2 threads each.
//
//   bench_sched --benchmark_repetitions=7 --benchmark_report_aggregates_only=true
//               --benchmark_enable_random_interleaving=true
//
// Model: x[500, 784] -> matmul W1[784, 500] + b1 -> relu -> matmul W2[500, 10] + b2
// -> cross_entropy with i32 labels; forward + backward in one graph, gradients
// accumulating into the params' accumulators (as with gradient accumulation; no
// optimizer step). The graph is scheduled and allocated once; each iteration is
// one Scheduler::compute() (5 matmuls: 2 forward, 3 backward, ~0.8 GFLOP).
//
//   BM_step/cpu_direct   the CPU backend without a scheduler (GraphAllocator + compute)
//   BM_step/cpu          Scheduler({cpu})
//   BM_step/blas_cpu     Scheduler({blas, cpu}): matmuls on OpenBLAS, the rest on CPU;
//                        BLAS slices each product over its own kiln pool (BlasThreads::pool)
//   BM_step/blas_openblas_cpu  the same with OpenBLAS's own threads (BlasThreads::openblas)
// Counter GFLOPS = matmul flops of the step / time.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/context.h"
#include "kiln/cpu.h"
#include "kiln/ext/alloc.h"
#include "kiln/ext/sched.h"
#include "kiln/graph.h"
#include "kiln/ops.h"
#if KILN_HAVE_BLAS
#include "kiln/blas.h"
#endif

namespace {

using namespace kiln;

constexpr int kThreads = 2;
constexpr int64_t kBatch = 500, kIn = 784, kHidden = 500, kClasses = 10;
// x@W1, h@W2 forward; dW1 = x^T@dh, dW2 = h^T@dz, dh = dz@W2^T backward.
constexpr double kFlops = 2.0 * (2 * kBatch * kIn * kHidden + 3 * kBatch * kHidden * kClasses);

struct Step {
  Context ctx;
  Graph graph;
  Tensor x, labels;
  std::vector<Tensor> params;

  Step() {
    x = ctx.input(f32, {kBatch, kIn}, "x");
    labels = ctx.input(i32, {kBatch}, "labels");
    Tensor w1 = ctx.param(f32, {kIn, kHidden}, "w1"), b1 = ctx.param(f32, {kHidden}, "b1");
    Tensor w2 = ctx.param(f32, {kHidden, kClasses}, "w2"), b2 = ctx.param(f32, {kClasses}, "b2");
    params = {w1, b1, w2, b2};
    Tensor loss = cross_entropy(matmul(relu(matmul(x, w1) + b1), w2) + b2, labels);
    graph = Graph::forward(loss);
    graph.backward(loss);
  }

  void fill() {
    uint32_t s = 12345;
    auto rnd = [&] { return float((s = s * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f; };
    std::vector<float> v(size_t(kBatch * kIn));
    for (float& f : v) f = rnd();
    x.set(v);
    for (Tensor p : params) {
      std::vector<float> w(size_t(p.numel()));
      for (float& f : w) f = rnd() * 0.1f;
      p.set(w);
    }
    std::vector<int32_t> lab(static_cast<size_t>(kBatch));
    for (size_t i = 0; i < lab.size(); ++i) lab[i] = int32_t(i % kClasses);
    labels.set(lab);
  }
};

enum Mode { kCpuDirect, kCpu, kBlasCpu, kBlasOpenblasCpu };

void BM_step(benchmark::State& state, Mode mode) {
  Step step;
  CpuBackend cpu(kThreads);
  std::unique_ptr<Backend> blas;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<GraphAllocator> galloc;
  if (mode == kCpuDirect) {
    galloc = std::make_unique<GraphAllocator>(cpu.buffer_type());
    galloc->alloc(step.graph);
  } else if (mode == kCpu) {
    sched = std::make_unique<Scheduler>(std::vector<Backend*>{&cpu});
    sched->alloc(step.graph);
  } else {
#if KILN_HAVE_BLAS
    blas = std::make_unique<BlasBackend>(
        kThreads, false, mode == kBlasCpu ? BlasThreads::pool : BlasThreads::openblas);
    sched = std::make_unique<Scheduler>(std::vector<Backend*>{blas.get(), &cpu});
    sched->alloc(step.graph);
#else
    state.SkipWithError("kiln was built without OpenBLAS (KILN_HAVE_BLAS)");
    return;
#endif
  }
  step.fill();
  auto run = [&] {
    if (sched) sched->compute(step.graph);
    else cpu.compute(step.graph);
  };
  run();  // warm-up: pages touched, pools and OpenBLAS threads started
  for (auto _ : state) run();
  state.counters["GFLOPS"] =
      benchmark::Counter(kFlops * double(state.iterations()) / 1e9, benchmark::Counter::kIsRate);
  if (sched) state.counters["splits"] = double(sched->n_splits());
}

BENCHMARK_CAPTURE(BM_step, cpu_direct, kCpuDirect)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_step, cpu, kCpu)->Unit(benchmark::kMillisecond)->UseRealTime();
#if KILN_HAVE_BLAS
BENCHMARK_CAPTURE(BM_step, blas_cpu, kBlasCpu)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK_CAPTURE(BM_step, blas_openblas_cpu, kBlasOpenblasCpu)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
