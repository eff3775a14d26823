// Reproducible test inputs: n floats uniform in [-1, 1) from std::mt19937(seed),
// and the same scaled and rounded to bf16 (bits and their exact f32 widening).
#pragma once
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
