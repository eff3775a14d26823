// Internal to the CUDA backend: how reduce.cu sums along an axis, kept free of
// CUDA-only constructs so that tests check it on machines without a GPU.
#pragma once
#include <cstdint>

#ifdef __CUDACC__
#define KILN_HOST_DEVICE __host__ __device__
#else
#define KILN_HOST_DEVICE
#endif

namespace kiln::cuda {

// Terms per partial sum of an axis sum: the CPU kernels' kRowBlock.
inline constexpr int64_t kSumRun = 256;
inline constexpr int64_t kLongAxis = 1024;    // axis length from which a block reduces one output
inline constexpr int64_t kFewOutputs = 4096;  // ... always when there are at most this many

// Sum of at(k) for k in [0, len) the way the CPU sums a strided axis: runs of
// kSumRun terms added in order, the run sums added in order. A plain running
// sum over a long axis loses precision as the total grows (1M terms drift
// ~1e-3 relative); this keeps each addition's operands of similar size, and
// gives the CPU's bits for axes it sums this way.
template <class At>
KILN_HOST_DEVICE inline float blocked_sum(int64_t len, At at) {
  float total = 0.0f;
  for (int64_t k0 = 0; k0 < len; k0 += kSumRun) {
    const int64_t k1 = k0 + kSumRun < len ? k0 + kSumRun : len;
    float part = 0.0f;
    for (int64_t k = k0; k < k1; ++k) part += at(k);
    total += part;
  }
  return total;
}

// Who reduces one output of an axis reduction: one thread (adjacent outputs in
// adjacent threads: coalesced when the outputs are the contiguous dim) or one
// block (its threads read the axis together: coalesced when the axis is the
// contiguous dim, and a tree of partial sums for long axes). Chosen from shape
// and layout only, so a result never depends on timing.
enum class AxisPath { thread, block };
inline AxisPath axis_path(int64_t len, int64_t n_out, int64_t step_bytes, int64_t esize) {
  if (len < kLongAxis || n_out > (int64_t(1) << 31) - 1) return AxisPath::thread;
  return n_out <= kFewOutputs || step_bytes == esize ? AxisPath::block : AxisPath::thread;
}

}  // namespace kiln::cuda
