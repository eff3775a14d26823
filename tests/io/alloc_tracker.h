// The largest single operator-new allocation between start and stop (see
// alloc_tracker.cpp, which replaces operator new in the io test binary).
#pragma once
#include <cstddef>

namespace kiln_test {
void start_tracking_allocations();
size_t stop_tracking_allocations();  // the largest allocation in bytes
}  // namespace kiln_test
