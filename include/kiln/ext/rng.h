// Counter-based RNG shared by every backend and the test reference, so a seeded
// op (dropout's mask) gives the same values everywhere and for any thread split.
#pragma once
#include <cstdint>

// The CUDA kernels (src/backends/cuda) compile these same functions for the device.
#if defined(__CUDACC__)
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::detail {

KILN_HOST_DEVICE inline uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// rng_uniform with the seed's own mix done once: mixed = splitmix64(seed)
// (the fused attention dropout draws many elements of one seed).
KILN_HOST_DEVICE inline float rng_uniform_mixed(uint64_t mixed, uint64_t index) {
  uint64_t h = splitmix64(mixed ^ index);
  return float(h >> 40) * (1.0f / 16777216.0f);
}

// Uniform in [0, 1) for element `index` of a tensor drawn with `seed`.
KILN_HOST_DEVICE inline float rng_uniform(uint64_t seed, uint64_t index) {
  return rng_uniform_mixed(splitmix64(seed), index);
}

}  // namespace kiln::detail
