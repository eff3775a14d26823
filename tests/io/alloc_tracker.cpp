// Replaces the global operator new/delete of the io test binary so tests can
// assert that parsing a corrupt file never makes a huge allocation. Tracking is
// off unless a test turns it on. Every form is replaced (malloc/free underneath)
// so allocation and release always pair up, also under AddressSanitizer.
#include "alloc_tracker.h"

#include <atomic>
#include <cstdlib>
#include <new>

namespace kiln_test {
namespace {
std::atomic<bool> g_tracking{false};
std::atomic<size_t> g_largest{0};
}  // namespace

void start_tracking_allocations() {
  g_largest = 0;
  g_tracking = true;
}

size_t stop_tracking_allocations() {
  g_tracking = false;
  return g_largest;
}

}  // namespace kiln_test

namespace {
void* allocate(size_t n) {
  if (kiln_test::g_tracking.load(std::memory_order_relaxed)) {
    size_t cur = kiln_test::g_largest.load(std::memory_order_relaxed);
    while (n > cur && !kiln_test::g_largest.compare_exchange_weak(cur, n)) {}
  }
  return std::malloc(n ? n : 1);
}
}  // namespace

void* operator new(size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  if (void* p = allocate(n)) return p;
  throw std::bad_alloc();
}
void* operator new(size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void* operator new[](size_t n, const std::nothrow_t&) noexcept { return allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }
void operator delete[](void* p, size_t) noexcept { std::free(p); }
void operator delete(void* p, const std::nothrow_t&) noexcept { std::free(p); }
void operator delete[](void* p, const std::nothrow_t&) noexcept { std::free(p); }
