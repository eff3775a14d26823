// Internal to src/dist: the communicator's state and its non-blocking
// collectives, shared by communicator.cpp and data_parallel.cpp. MPI appears
// only here and in the .cpp files (kiln/dist.h stays MPI-free).
#pragma once
#include <chrono>
#include <cstddef>
#include <mutex>

#include "kiln/dist.h"

#ifndef KILN_HAVE_MPI
#define KILN_HAVE_MPI 0
#endif
#if KILN_HAVE_MPI
#include <mpi.h>
#endif

namespace kiln::dist {

#if KILN_HAVE_MPI
using Request = MPI_Request;
inline const Request kNoRequest = MPI_REQUEST_NULL;
#else
using Request = int;
inline constexpr Request kNoRequest = 0;
#endif

enum class Elem : uint8_t { f32, f64, i32, byte };

struct Communicator::Impl {
  int rank = 0, size = 1;
  bool mpi = false;
  bool threads_ok = true;  // MPI_THREAD_SERIALIZED or better: any thread may call, one at a time
  double timeout = 300;
  // Every MPI call holds this, so calls from the training and the
  // communication thread never overlap (what MPI_THREAD_SERIALIZED asks).
  std::mutex mu;
#if KILN_HAVE_MPI
  MPI_Comm comm = MPI_COMM_NULL;
#endif

  // Start a collective; with one rank nothing is started (kNoRequest).
  Request iallreduce(void* data, size_t count, Elem e);  // sum, in place
  Request ibcast(void* data, size_t bytes, int root);
  Request ibarrier();
  // True when r completed (r becomes kNoRequest). Drives MPI's progress.
  bool test(Request& r);
  // Until r completes; past the timeout the job is aborted naming `what`.
  void wait(Request& r, const char* what);
  [[noreturn]] void abort(const std::string& message, int code);
  // The abort for a wait that ran out of time.
  [[noreturn]] void timed_out(const char* what);
};

using Clock = std::chrono::steady_clock;
inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace kiln::dist
