// cuBLAS is opened with dlopen on first use (src/backends/cuda/cublas_api.h), not
// linked: this runs without a GPU and checks that the library this kiln was built
// against is found and has every entry point the backend calls.
#include <gtest/gtest.h>

#include <string>

#if KILN_HAVE_CUDA
#include "backends/cuda/cublas_api.h"

namespace kiln::test {
namespace {

TEST(CudaCublasLoader, LoadsTheLibraryAndResolvesEveryEntryPoint) {
  const cuda::CublasApi& api = cuda::cublas();
  ASSERT_NE(api.create, nullptr);
  ASSERT_NE(api.gemm_strided_batched_ex, nullptr);
  // Calls into the loaded library (these need no device).
  EXPECT_EQ(std::string(api.status_name(CUBLAS_STATUS_SUCCESS)), "CUBLAS_STATUS_SUCCESS");
  EXPECT_EQ(&cuda::cublas(), &api) << "loaded once";
}

}  // namespace
}  // namespace kiln::test
#endif
