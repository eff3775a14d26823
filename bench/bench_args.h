// `--name value` arguments of the benchmark programs that take no Google
// Benchmark flags (bench_generate, bench_batch_generate).
#pragma once
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace bench {

// The integer after `name`, or `def` when `name` is absent.
inline int64_t arg(int argc, char** argv, const char* name, int64_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::atoll(argv[i + 1]);
  return def;
}

// The text after `name`, or `def` when `name` is absent.
inline std::string sarg(int argc, char** argv, const char* name, const char* def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  return def;
}

}  // namespace bench
