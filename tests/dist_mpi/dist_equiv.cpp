// Equivalence of data-parallel training (run under mpirun, see CMakeLists.txt):
// N ranks with physical batch B each end with the same parameters after k
// optimizer steps as one process with batch N*B (rank 0 computes that
// reference itself), within 1e-5 relative; every rank holds bit-identical
// parameters; evaluation sums over ranks; a checkpoint written by rank 0 loads
// on every rank. Exit status 0 on success; rank 0 prints the differences.
//
//   mpirun -np 4 tests/kiln_dist_equiv <scratch dir>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <string>

#include "../opt/opt_test_util.h"
#include "kiln/dist.h"

using namespace kiln;
using namespace kiln::test;

namespace {

int failures = 0;

void check(bool ok, int rank, const std::string& what) {
  if (ok) return;
  std::fprintf(stderr, "dist_equiv: rank %d: FAILED: %s\n", rank, what.c_str());
  ++failures;
}

// max |a - b| / max |b| over the tensor.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0, m = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
    m = std::max(m, std::fabs(double(b[i])));
  }
  return m > 0 ? d / m : d;
}

struct Scenario {
  const char* name;
  OptimizerType optimizer;
  int64_t accumulate;  // physical batches per step
  dist::DataParallelOptions dp;
};

OptimizerParams hyper(OptimizerType t) {
  OptimizerParams p;
  p.adamw.lr = 0.01f;
  p.adamw.weight_decay = 0.01f;
  p.sgd.lr = 0.1f;
  p.sgd.momentum = 0.9f;
  return p;
}

constexpr int64_t kB = 8;      // per-rank physical batch
constexpr int64_t kSteps = 5;  // optimizer steps compared
constexpr int64_t kHidden = 64;

void run(dist::Communicator& comm, const Scenario& sc, const std::string& dir) {
  const int N = comm.size(), r = comm.rank();
  const int64_t logical = kB * sc.accumulate;
  const int64_t n_train = kSteps * N * logical, n_val = 3 * N * kB;
  FitOptions fo;
  fo.epochs = 1;
  fo.progress = false;

  // N ranks, batch B each.
  Dataset data = make_blobs(n_train + n_val, 21);
  Mlp mlp(kB, kHidden);
  dist::DataParallel dp(comm, sc.dp);
  OptConfig cfg = mlp.config(logical);
  cfg.optimizer = sc.optimizer;
  cfg.schedule = schedule::constant(hyper(sc.optimizer));
  cfg.parallel = &dp;
  OptContext opt(cfg);
  mlp.init(uint64_t(100 + r));  // different on purpose: rank 0's are broadcast
  const SampleRange train{0, n_train}, val{n_train, n_train + n_val};
  data.shuffle(99, train);  // the same order on every rank
  const std::vector<EpochResult> h = {epoch(opt, data, train, val, fo)};
  check(opt.step() == kSteps, r,
        std::string(sc.name) + ": " + std::to_string(opt.step()) + " steps");

  // Every rank holds rank 0's parameters, bit for bit.
  for (const Tensor& p : mlp.params()) {
    std::vector<float> mine = values(p), root = mine;
    comm.broadcast(
        std::span<std::byte>(reinterpret_cast<std::byte*>(root.data()), root.size() * 4));
    check(mine == root, r, std::string(sc.name) + ": " + p.name() + " differs from rank 0's");
  }

  // A checkpoint from rank 0 loads on every rank.
  const std::string path = dir + "/dist_equiv_np" + std::to_string(N) + ".gguf";
  opt.save(path);
  {
    Mlp back(kB, kHidden);
    OptConfig bc = back.config(logical);
    bc.optimizer = sc.optimizer;
    bc.schedule = cfg.schedule;
    OptContext ob(bc);
    ob.load(path);
    check(ob.step() == kSteps, r,
          std::string(sc.name) + ": loaded step " + std::to_string(ob.step()));
    for (size_t i = 0; i < 4; ++i)
      check(values(back.params()[i]) == values(mlp.params()[i]), r,
            std::string(sc.name) + ": loaded " + back.params()[i].name() + " differs");
  }
  comm.barrier();
  if (r == 0) std::filesystem::remove(path);

  if (r != 0) return;
  // The reference: one process, batch N*B, the same data, order and init.
  Dataset ref_data = make_blobs(n_train + n_val, 21);
  Mlp ref(N * kB, kHidden);
  OptConfig rc = ref.config(N * logical);
  rc.optimizer = sc.optimizer;
  rc.schedule = cfg.schedule;
  OptContext ro(rc);
  ref.init(100);
  ref_data.shuffle(99, train);
  const std::vector<EpochResult> rh = {epoch(ro, ref_data, train, val, fo)};
  double worst = 0;
  for (size_t i = 0; i < 4; ++i) {
    const double d = rel_diff(values(mlp.params()[i]), values(ref.params()[i]));
    worst = std::max(worst, d);
    check(d <= 1e-5, r,
          std::string(sc.name) + ": " + ref.params()[i].name() + " relative difference " +
              std::to_string(d) + " > 1e-5");
  }
  const double dl = std::fabs(h[0].val.loss() - rh[0].val.loss()) / std::fabs(rh[0].val.loss());
  check(h[0].val.n_samples == rh[0].val.n_samples, r,
        std::string(sc.name) + ": validation sample counts differ");
  check(h[0].train.n_samples == rh[0].train.n_samples, r,
        std::string(sc.name) + ": training sample counts differ");
  check(dl <= 1e-5, r,
        std::string(sc.name) + ": validation loss " + std::to_string(h[0].val.loss()) + " vs " +
            std::to_string(rh[0].val.loss()));
  check(h[0].val.n_correct == rh[0].val.n_correct, r,
        std::string(sc.name) + ": validation accuracy differs");
  std::printf(
      "dist_equiv: np %d %-22s %zu buckets, %lld steps: max relative param difference %.2e, val "
      "loss %.6f "
      "vs %.6f\n",
      N, sc.name, dp.n_buckets(), (long long)kSteps, worst, h[0].val.loss(), rh[0].val.loss());
}

}  // namespace

int main(int argc, char** argv) {
  dist::Communicator comm;
  const std::string dir = argc > 1 ? argv[1] : std::filesystem::temp_directory_path().string();
  if (comm.size() < 2)
    std::fprintf(stderr, "dist_equiv: warning: one rank (run it under mpirun -np N)\n");
  const Scenario scenarios[] = {
      {"adamw thread-progress",
       OptimizerType::adamw,
       1,
       {.bucket_bytes = 512, .overlap = true, .progress_thread = true}},
      {"sgd+momentum accum 2",
       OptimizerType::sgd,
       2,
       {.bucket_bytes = 256, .overlap = true, .progress_thread = false}},
      {"adamw no overlap", OptimizerType::adamw, 1, {.bucket_bytes = 1 << 20, .overlap = false}},
  };
  for (const Scenario& sc : scenarios) run(comm, sc, dir);
  // Every rank's verdict counts.
  double f[1] = {double(failures)};
  comm.allreduce(std::span<double>(f));
  if (comm.rank() == 0) std::printf("dist_equiv: %s\n", f[0] == 0 ? "ok" : "FAILED");
  return f[0] == 0 ? 0 : 1;
}
