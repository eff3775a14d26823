// The rounding of x that every int8 row-dot path of x @ W^T shares (the
// k-quants' BlockQ8K, the AVX2 path of the 32-value blocks, the VNNI path of
// Q8_0 / Q4_0): a block of n values becomes int8 quants q and one f32 step d,
// as ggml's Q8_0 / Q8_K: d = max |x| / 127, q = round-to-nearest-even(x / d)
// (computed as x * (127 / max |x|)), so each value moves by at most d / 2.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

namespace kiln::cpu::qmatmul_detail {

// Rounds x[0..n) into q and returns d. An all-zero block (or one whose max is
// below ~1e-36, where 127 / max overflows) gives d = 0 and q = 0; a block
// holding inf or NaN gives d = NaN (its outputs become NaN) and q = 0.
inline float round_x_block(const float* x, int n, int8_t* q) {
  float amax = 0;
  bool finite = true;
  for (int v = 0; v < n; ++v) {
    const float a = std::abs(x[v]);
    finite = finite && a <= std::numeric_limits<float>::max();  // false for inf, NaN
    amax = std::max(amax, a);
  }
  const float inv = 127 / amax;
  if (!finite || !std::isfinite(inv)) {
    std::memset(q, 0, size_t(n));
    return finite ? 0.f : std::numeric_limits<float>::quiet_NaN();
  }
  for (int v = 0; v < n; ++v) q[v] = int8_t(std::clamp(std::nearbyint(x[v] * inv), -127.f, 127.f));
  return amax / 127;
}

}  // namespace kiln::cpu::qmatmul_detail
