// The backends the op tests compare with the CPU backend. Entry 0 is the
// baseline. A new backend (BLAS, CUDA) is one more entry here, typically with
// bitwise = false and a tol_scale for its different summation order.
#include "ops/harness/check.h"

namespace kiln::test {

const std::vector<BackendSpec>& test_backends() {
  static const std::vector<BackendSpec> backends = {
      {"cpu1", [] { return std::unique_ptr<Backend>(new CpuBackend(1)); }, true, 1.0},
      // Results must not depend on the thread count: bit-identical to cpu1.
      {"cpu2", [] { return std::unique_ptr<Backend>(new CpuBackend(2)); }, true, 1.0},
      {"cpu3", [] { return std::unique_ptr<Backend>(new CpuBackend(3)); }, true, 1.0},
  };
  return backends;
}

}  // namespace kiln::test
