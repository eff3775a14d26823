// Reproducible test inputs: n floats uniform in [-1, 1) from std::mt19937(seed)
// (or in [-bound, bound) from a test's generator), the same scaled and rounded
// to bf16 (bits and their exact f32 widening), and the largest difference.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kiln/dtype.h"

namespace kiln_test {

inline std::vector<float> uniform_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// n floats uniform in [-bound, bound) drawn from `rng` (a test's own stream).
inline std::vector<float> uniform_floats(size_t n, std::mt19937& rng, float bound) {
  std::uniform_real_distribution<float> u(-bound, bound);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

// max |a[i] - b[i]| (the sizes must agree).
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

struct Bf16Values {
  std::vector<uint16_t> bits;
  std::vector<float> widened;  // bf16_to_f32 of bits: what an f32 op should read
};
inline Bf16Values bf16_values(size_t n, uint32_t seed, float scale) {
  const std::vector<float> v = uniform_floats(n, seed);
  Bf16Values r{std::vector<uint16_t>(n), std::vector<float>(n)};
  for (size_t i = 0; i < n; ++i) {
    r.bits[i] = kiln::f32_to_bf16(v[i] * scale);
    r.widened[i] = kiln::bf16_to_f32(r.bits[i]);
  }
  return r;
}

}  // namespace kiln_test
