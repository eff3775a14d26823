// Data-parallel figures (docs/distributed.md, docs/benchmarks.md). Run it under
// mpirun; alone it measures one rank (the N = 1 step time).
//
//   mpirun -np 2 build/release/bench/bench_dist [--reps 30] [--steps 30] [--threads 1]
//
// 1. Allreduce of a model's gradients, in the same run: kiln's bucketed path
//    (DataParallel, one in-place MPI_Iallreduce per bucket, driven by its
//    communication thread) at several bucket sizes, against one blocking
//    MPI_Allreduce of the whole gradient. Median time per reduction and the
//    algorithm bandwidth (gradient bytes / time).
// 2. Time per training step (forward, backward, gradient averaging, AdamW) of
//    two MLPs, per-rank batch fixed (weak scaling), with the reduction
//    overlapped with the backward pass or started after it, and the share of
//    the reduction that the backward pass hid (DataParallelStats::overlap).
// Not a Google Benchmark program: every rank must run the same iterations.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kiln/dist.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

#if KILN_HAVE_MPI
#include <mpi.h>
#endif

using namespace kiln;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

struct Model {
  const char* name;
  std::vector<int64_t> widths;  // inputs, hidden..., classes
};

int64_t n_params(const Model& m) {
  int64_t n = 0;
  for (size_t i = 0; i + 1 < m.widths.size(); ++i)
    n += m.widths[i] * m.widths[i + 1] + m.widths[i + 1];
  return n;
}

// ---------------------------------------------------------------------------
// 1. Allreduce of the gradients.

void bench_allreduce(dist::Communicator& comm, const Model& m, int reps) {
  // The gradients as OptContext lays them out: contiguous, last layer first.
  Context ctx;
  std::vector<Tensor> grads;
  for (size_t i = m.widths.size() - 1; i > 0; --i) {
    grads.push_back(ctx.tensor(f32, {m.widths[i]}, "b" + std::to_string(i)));
    grads.push_back(ctx.tensor(f32, {m.widths[i - 1], m.widths[i]}, "w" + std::to_string(i)));
  }
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  for (Tensor& g : grads) {
    std::vector<float> v(size_t(g.numel()), 0.001f * float(comm.rank() + 1));
    g.set(v);
  }
  const double bytes = double(n_params(m)) * 4;
  auto report = [&](const char* path, double t) {
    if (comm.rank() == 0)
      std::printf("allreduce  %-6s %6.2f MB  %-24s %8.3f ms  %6.2f GB/s\n", m.name, bytes / 1e6,
                  path, t * 1e3, bytes / t / 1e9);
  };
  for (size_t bucket : {size_t(256) << 10, size_t(1) << 20, size_t(4) << 20}) {
    dist::DataParallel dp(comm, {.bucket_bytes = bucket});
    dp.attach(grads);
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      comm.barrier();
      const auto t0 = Clock::now();
      dp.grads_ready(grads.size());
      dp.finish_grads();
      if (r >= 2) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    const std::string label = "kiln buckets " + std::to_string(bucket >> 10) + " KiB (" +
                              std::to_string(dp.n_buckets()) + ")";
    report(label.c_str(), median(t));
  }
#if KILN_HAVE_MPI
  if (comm.uses_mpi()) {
    float* base = static_cast<float*>(grads.front().node()->data);
    const TensorNode* last = grads.back().node();
    const int count = int(static_cast<const float*>(last->data) + last->numel() - base);
    std::vector<double> t;
    for (int r = 0; r < reps + 2; ++r) {
      comm.barrier();
      const auto t0 = Clock::now();
      MPI_Allreduce(MPI_IN_PLACE, base, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      if (r >= 2) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    report("one MPI_Allreduce", median(t));
  }
#endif
}

// ---------------------------------------------------------------------------
// 2. Training steps.

void bench_steps(dist::Communicator& comm, const Model& m, int64_t B, int steps, int threads,
                 bool overlap) {
  Context ctx;
  Tensor x = ctx.input(f32, {B, m.widths.front()}, "x");
  Tensor h = x;
  std::vector<Tensor> ws;
  for (size_t i = 0; i + 1 < m.widths.size(); ++i) {
    Tensor w = ctx.param(f32, {m.widths[i], m.widths[i + 1]}, "w" + std::to_string(i));
    Tensor b = ctx.param(f32, {m.widths[i + 1]}, "b" + std::to_string(i));
    ws.push_back(w);
    h = matmul(h, w) + b;
    if (i + 2 < m.widths.size()) h = relu(h);
  }
  dist::DataParallel dp(comm, {.overlap = overlap});
  OptConfig cfg;
  cfg.inputs = x;
  cfg.outputs = h;
  cfg.n_threads = threads;
  cfg.parallel = &dp;
  OptContext opt(cfg);
  for (size_t i = 0; i < ws.size(); ++i) kaiming_uniform(ws[i], m.widths[i], 1 + i);
  std::mt19937 rng(7 + comm.rank());
  std::vector<float> xs(size_t(B * m.widths.front()));
  for (float& v : xs) v = float(rng() % 256) / 255.0f;
  std::vector<int32_t> ys(static_cast<size_t>(B));
  for (int32_t& y : ys) y = int32_t(rng() % uint32_t(m.widths.back()));
  opt.inputs().set(xs);
  opt.labels().set(ys);
  std::vector<double> t;
  for (int s = 0; s < steps + 3; ++s) {
    if (s == 3) dp.reset_stats();
    const auto t0 = Clock::now();
    opt.train_batch();
    if (s >= 3) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  // Rank 0 reports; the ranks' medians differ little (each waits for the others).
  const dist::DataParallelStats& st = dp.stats();
  if (comm.rank() == 0) {
    if (comm.size() == 1) {
      std::printf("step  %-6s %5.2f M params  N=1 batch %lld: %8.2f ms/step\n", m.name,
                  double(n_params(m)) / 1e6, (long long)B, median(t) * 1e3);
    } else {
      std::printf(
          "step  %-6s %5.2f M params  N=%d batch %lld/rank %-10s: %8.2f ms/step, reduce %6.2f ms, "
          "waited %6.2f ms (%2.0f%% hidden), %zu buckets\n",
          m.name, double(n_params(m)) / 1e6, comm.size(), (long long)B,
          overlap ? "overlap" : "no overlap", median(t) * 1e3,
          st.reduce_seconds / double(st.steps) * 1e3, st.wait_seconds / double(st.steps) * 1e3,
          100 * st.overlap(), dp.n_buckets());
    }
  }
}

int arg(int argc, char** argv, const char* name, int def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  dist::Communicator comm;
  const int reps = arg(argc, argv, "--reps", 30);
  const int steps = arg(argc, argv, "--steps", 30);
  const int threads = arg(argc, argv, "--threads", 1);
  const Model models[] = {{"fc", {784, 500, 10}}, {"mlp4", {784, 1024, 1024, 1024, 10}}};
  if (comm.rank() == 0) {
    double load[1] = {0};
    if (FILE* f = std::fopen("/proc/loadavg", "r")) {
      if (std::fscanf(f, "%lf", &load[0]) != 1) load[0] = -1;
      std::fclose(f);
    }
    std::printf("bench_dist: %d rank(s)%s, %d thread(s) per rank, load average %.2f\n", comm.size(),
                comm.uses_mpi() ? " (MPI)" : "", threads, load[0]);
  }
  if (comm.size() > 1)
    for (const Model& m : models) bench_allreduce(comm, m, reps);
  for (const Model& m : models)
    for (bool overlap : {true, false}) {
      if (comm.size() == 1 && !overlap) continue;
      bench_steps(comm, m, 128, steps, threads, overlap);
    }
  return 0;
}
