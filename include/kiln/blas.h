// The BLAS backend: matmul through OpenBLAS's cblas_sgemm, on host memory.
//
// Only in builds with OpenBLAS (CMake option KILN_BLAS, found automatically);
// those define KILN_HAVE_BLAS=1 for kiln and for programs linking kiln:
//
//   #if KILN_HAVE_BLAS
//   kiln::BlasBackend blas(4);         // matmul only: pair it with a CPU backend
//   kiln::CpuBackend cpu(4);
//   kiln::Scheduler sched({&blas, &cpu});
//   #endif
//
// By default the backend supports MATMUL with f32 inputs whose last two dims map
// onto sgemm (row-major, or transposed: a view x.T() is passed with CblasTrans,
// never copied; batch dims loop over sgemm calls), and nothing else: the
// Scheduler sends every other op to the next backend. With cpu_kernels = true it
// runs all other ops (and the matmuls sgemm cannot take) with the CPU backend's
// kernels, so it can also run whole graphs by itself (what the registry's
// "blas" entry creates).
//
// Threads (BlasThreads): by default the backend splits each product into
// n_threads slices of C and runs them on its own kiln thread pool, one
// single-threaded sgemm per slice; OpenBLAS's own threads stay asleep.
// OpenBLAS's workers busy-wait for a long while after each call (about 0.1 s),
// so with BlasThreads::openblas they spin next to the CPU backend's threads
// while it runs the ops between the matmuls (see docs/benchmarks.md). OpenBLAS's
// thread count is process-wide: each compute() sets it (to 1, or to n_threads
// with BlasThreads::openblas) only when it differs.
#pragma once
#include <memory>
#include <string>

#include "kiln/backend.h"

namespace kiln {

enum class BlasThreads {
  pool,      // kiln's thread pool, single-threaded sgemm per slice (default)
  openblas,  // openblas_set_num_threads(n_threads), one sgemm call per product
};

class BlasBackend : public Backend {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit BlasBackend(int n_threads = 0, bool cpu_kernels = false,
                       BlasThreads threads = BlasThreads::pool);
  ~BlasBackend() override;
  const char* name() const override { return "BLAS"; }
  BufferType& buffer_type() override { return host_buffer_type(); }
  bool supports_op(const TensorNode* node) const override;
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override;
  int n_threads() const;
  void set_n_threads(int n);
  bool cpu_kernels() const;
  BlasThreads threads() const;

  // True when `node` is a MATMUL that sgemm can compute directly (f32 inputs,
  // layouts expressible with lda/ldb and transpose flags).
  static bool sgemm_can_run(const TensorNode* node);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The BLAS library kiln was linked with, e.g. "OpenBLAS 0.3.21 DYNAMIC_ARCH
// NO_AFFINITY Haswell MAX_THREADS=64".
std::string blas_library_info();
// Short form for listings: "OpenBLAS 0.3.21 (Haswell kernels) sgemm + CPU kernels".
std::string blas_description();

}  // namespace kiln
