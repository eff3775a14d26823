// Wall time for the training loops' logs and results.
#pragma once

#include <chrono>

namespace kiln::detail {

using SteadyClock = std::chrono::steady_clock;

inline double seconds_since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

}  // namespace kiln::detail
