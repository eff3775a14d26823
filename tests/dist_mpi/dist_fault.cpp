// Fault behaviour (run under mpirun by ctest, see CMakeLists.txt): rank 1 stops
// taking part in training after two steps, and the other ranks must not wait
// forever.
//   die:  rank 1 is killed (SIGKILL); Open MPI's mpirun ends the job.
//   hang: rank 1 sleeps; the others' watchdog (KILN_DIST_TIMEOUT) aborts the job
//         with "[dist] rank 0 of N: the gradient allreduce did not complete ...".
// Success for the test is a non-zero exit within seconds, never a hang.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <thread>

#include "../opt/opt_test_util.h"
#include "kiln/dist.h"

using namespace kiln;
using namespace kiln::test;

int main(int argc, char** argv) {
  const bool die = argc > 1 && std::strcmp(argv[1], "die") == 0;
  dist::Communicator comm;
  Dataset data = make_blobs(4096, 1);
  Mlp mlp(8, 32);
  dist::DataParallel dp(comm, {.bucket_bytes = 256});
  OptConfig cfg = mlp.config();
  cfg.parallel = &dp;
  OptContext opt(cfg);
  mlp.init(1);
  for (int64_t step = 0; step < 200; ++step) {
    if (step == 2 && comm.rank() == 1) {
      std::fprintf(stderr, "dist_fault: rank 1 %s at step %lld\n", die ? "dies" : "stops",
                   (long long)step);
      std::fflush(stderr);
      if (die) std::raise(SIGKILL);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    data.get_batch(opt.inputs(), opt.labels(), step * comm.size() + comm.rank());
    opt.train_batch();
  }
  // Reaching this means the others ran past a dead rank: wrong.
  std::fprintf(stderr, "dist_fault: rank %d finished although rank 1 stopped\n", comm.rank());
  return comm.size() > 1 ? 0 : 2;
}
