// kiln_ops_perf: the op-test harness's perf mode (never a ctest test).
//
//   ninja -C build/release kiln_ops_perf
//   build/release/tests/kiln_ops_perf [filter] [--reps N] [--small]
//
// Prints, for every case whose name contains `filter`, the median wall time of one
// graph run at the case's perf size on each backend of test_backends() (CPU with
// 1 and 2 threads today); grad cases get a second row for forward+backward.
// This file is compiled into kiln_test_ops too, without main (KILN_OPS_PERF_MAIN
// is defined only for kiln_ops_perf), so the perf code is always built.
#ifdef KILN_OPS_PERF_MAIN
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "ops/harness/check.h"

int main(int argc, char** argv) {
  kiln::test::PerfOptions opt;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--reps") && i + 1 < argc) {
      opt.reps = std::max(1, std::atoi(argv[++i]));
    } else if (!std::strcmp(argv[i], "--small")) {
      opt.big = false;
    } else if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      std::cout << "usage: kiln_ops_perf [filter] [--reps N] [--small]\n";
      return 0;
    } else {
      opt.filter = argv[i];
    }
  }
  kiln::test::run_perf(opt, std::cout);
  return 0;
}
#endif
