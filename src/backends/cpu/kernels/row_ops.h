// Row helpers shared by the softmax-style kernels (SOFTMAX, CROSS_ENTROPY,
// ATTENTION): a contiguous f32 row's max and its sum of exp(x - max). Vector
// body, then a scalar tail, in a fixed order, so a row's result never depends
// on the thread split (vm's scalar and vector forms give identical bits).
#pragma once
#include <cstdint>
#include <limits>

#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

// max(y[0], ..., y[n - 1]); -inf for n == 0.
inline float row_max(const float* y, int64_t n) {
  using vm::VF;
  VF acc = vm::c<VF>(-std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + vm::kW <= n; c += vm::kW) acc = vm::max(acc, vm::loadv<VF>(y + c));
  float mx = vm::hmax(acc);
  for (; c < n; ++c) mx = y[c] > mx ? y[c] : mx;
  return mx;
}

// Sum of exp(y[c] - mx) over [0, n); with kStore also y[c] = exp(y[c] - mx).
// (Each vector is added as computed, never reloaded after its store.)
template <bool kStore, class T>
inline float exp_sum_impl(T* y, int64_t n, float mx) {
  using vm::VF;
  const VF vmx = vm::c<VF>(mx);
  VF acc = vm::c<VF>(0.0f);
  int64_t c = 0;
  for (; c + vm::kW <= n; c += vm::kW) {
    const VF e = vm::exp(vm::loadv<VF>(y + c) - vmx);
    acc = acc + e;
    if constexpr (kStore) vm::store(y + c, e);
  }
  float s = vm::hsum(acc);
  for (; c < n; ++c) {
    const float e = vm::exp(y[c] - mx);
    s += e;
    if constexpr (kStore) y[c] = e;
  }
  return s;
}
inline float exp_sum(const float* y, int64_t n, float mx) { return exp_sum_impl<false>(y, n, mx); }
inline float exp_store_sum(float* y, int64_t n, float mx) { return exp_sum_impl<true>(y, n, mx); }

}  // namespace kiln::cpu
