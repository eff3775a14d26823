// Reproducible test inputs: n floats uniform in [-1, 1) from std::mt19937(seed).
#pragma once
#include <cstdint>
#include <random>
#include <vector>

namespace kiln_test {

inline std::vector<float> uniform_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

}  // namespace kiln_test
