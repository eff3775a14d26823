// Tokenizer figures (docs/benchmarks.md): load time of a tokenizer.json, and
// encoding throughput on the State of the Union corpus (each file one
// document) with 1 and 2 threads, next to the JavaScript reference's MB/s in
// the same run (node tests/tokenizer/make_reference.mjs --bench NAME).
//   bash scripts/get-tokenizers.sh && bash scripts/get-sotu.sh
//   build/release/bench/bench_tokenizer [NAME=llama3] [--no-reference] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"
#include "kiln/tokenizer.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// CPU time of this thread: on a shared machine the wall time of a one-thread
// run also counts the time other programs held the core.
double cpu_seconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) * 1e-9;
}
double thread_cpu_seconds() { return cpu_seconds(CLOCK_THREAD_CPUTIME_ID); }
// All threads together: with 2 threads, equal to the 1-thread CPU time when
// the threads add no work (the wall time then halves on two idle cores).
double process_cpu_seconds() { return cpu_seconds(CLOCK_PROCESS_CPUTIME_ID); }

std::vector<std::string> sotu(const std::string& dir) {
  std::vector<std::string> names, docs;
  if (fs::is_directory(dir))
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".txt") names.push_back(e.path().string());
  std::sort(names.begin(), names.end());
  for (const auto& n : names) {
    std::ifstream f(n, std::ios::binary);
    std::ostringstream ss;
    ss << f.rdbuf();
    docs.push_back(ss.str());
  }
  return docs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string name = "llama3", root = KILN_SOURCE_DIR;
  bool reference = true;
  int reps = 3;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--no-reference") reference = false;
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else name = a;
  }
  std::string dir = root + "/data/tokenizers/" + name;
  std::vector<std::string> docs = sotu(root + "/data/sotu");
  if (!fs::exists(dir + "/tokenizer.json") || docs.empty()) {
    std::fprintf(
        stderr,
        "needs %s and data/sotu: bash scripts/get-tokenizers.sh && bash scripts/get-sotu.sh\n",
        dir.c_str());
    return 1;
  }
  size_t bytes = 0;
  for (const auto& d : docs) bytes += d.size();
  try {
    double load = 1e9, load_cpu = 1e9;
    for (int r = 0; r < reps; ++r) {
      auto t0 = Clock::now();
      double c0 = thread_cpu_seconds();
      kiln::Tokenizer t = kiln::Tokenizer::load(dir);
      load = std::min(load, seconds_since(t0));
      load_cpu = std::min(load_cpu, thread_cpu_seconds() - c0);
    }
    std::printf("%s: tokenizer.json %.1f MB, load %.0f ms wall, %.0f ms CPU (best of %d)\n",
                name.c_str(), double(fs::file_size(dir + "/tokenizer.json")) / 1e6, load * 1e3,
                load_cpu * 1e3, reps);
    kiln::Tokenizer tok = kiln::Tokenizer::load(dir);
    for (int threads : {1, 2}) {
      double best = 1e9, best_cpu = 1e9;
      size_t n = 0;
      for (int r = 0; r < reps; ++r) {
        // A fresh tokenizer each time: its word cache starts empty, as in a real run.
        kiln::Tokenizer fresh = kiln::Tokenizer::load(dir);
        auto t0 = Clock::now();
        double c0 = threads == 1 ? thread_cpu_seconds() : process_cpu_seconds();
        auto ids = fresh.encode_batch(docs, false, threads);
        best = std::min(best, seconds_since(t0));
        best_cpu =
            std::min(best_cpu, (threads == 1 ? thread_cpu_seconds() : process_cpu_seconds()) - c0);
        n = 0;
        for (const auto& v : ids) n += v.size();
      }
      std::printf("%s: SOTU %zu bytes -> %zu tokens, %d thread(s): %.1f MB/s wall", name.c_str(),
                  bytes, n, threads, double(bytes) / best / 1e6);
      std::printf(", %.1f MB/s of CPU time%s", double(bytes) / best_cpu / 1e6,
                  threads == 1 ? "" : " (all threads)");
      std::printf(" (best of %d)\n", reps);
    }
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  std::fflush(stdout);
  if (reference) {
    std::string cmd = "node " + root + "/tests/tokenizer/make_reference.mjs --bench " + name;
    if (std::system(cmd.c_str()) != 0)
      std::fprintf(stderr, "(the reference did not run: needs node)\n");
  }
  return 0;
}
