// Uniform integers for the datasets' shuffles and window draws: the same
// numbers on every platform (std::uniform_int_distribution's are not).
#pragma once

#include <cstdint>
#include <random>

namespace kiln::detail {

// Uniform in [0, n) from raw 64-bit engine output (rejection, no modulo bias).
inline uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t reject_below = (0 - n) % n;  // 2^64 mod n
  for (;;) {
    const uint64_t x = rng();
    if (x >= reject_below) return x % n;
  }
}

}  // namespace kiln::detail
