// Perf mode: each case at its perf size (Sz big), median wall time of one graph
// run per backend; grad cases also time forward+backward. Never part of ctest.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ostream>

#include "ops/harness/check.h"
#include "ops/harness/session.h"

namespace kiln::test {

namespace {

// Median ms per run (after one warm-up run), or a negative value on error.
double time_case(const Case& c, Backend& be, bool grad, int reps, std::string& err) {
  try {
    Session s(c, grad);
    s.allocate(be);
    s.run(be);
    be.synchronize();
    std::vector<double> ms;
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      s.run(be);
      be.synchronize();
      const auto t1 = std::chrono::steady_clock::now();
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  } catch (const std::exception& e) {
    err = e.what();
    return -1;
  }
}

std::string fmt(double ms) {
  char b[32];
  if (ms < 0) return "error";
  std::snprintf(b, sizeof b, "%.4f", ms);
  return b;
}

}  // namespace

void run_perf(const PerfOptions& opt, std::ostream& os) {
  const std::vector<Case> cases = make_cases(Sz{opt.big});
  const auto& backends = test_backends();
  char line[256];
  std::snprintf(line, sizeof line, "%-34s %-5s", "case (median ms per run)", "mode");
  os << line;
  for (const auto& b : backends) {
    std::snprintf(line, sizeof line, " %12s", b.name.c_str());
    os << line;
  }
  os << "\n";
  for (const Case& c : cases) {
    if (!opt.filter.empty() && c.name.find(opt.filter) == std::string::npos) continue;
    for (int mode = 0; mode < (c.grad ? 2 : 1); ++mode) {
      std::snprintf(line, sizeof line, "%-34s %-5s", c.name.c_str(), mode ? "f+b" : "fwd");
      os << line;
      std::string err;
      for (const auto& b : backends) {
        auto be = b.make();
        std::snprintf(line, sizeof line, " %12s",
                      fmt(time_case(c, *be, mode == 1, opt.reps, err)).c_str());
        os << line;
      }
      os << (err.empty() ? "" : "  (" + err + ")") << "\n";
      os.flush();
    }
  }
}

}  // namespace kiln::test
