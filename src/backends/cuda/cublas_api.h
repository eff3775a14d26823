// cuBLAS, loaded on first use instead of linked.
//
// Why: libcublas.so pulls in libcublasLt.so (over 500 MB); when a program links
// them, the dynamic loader maps and relocates both at start-up, about 0.5 s of
// CPU for every process that links kiln, GPU or not (every test binary paid it).
// kiln links only the small CUDA runtime and opens cuBLAS with dlopen when the
// first CudaBackend is created; programs that never use CUDA never load it.
#pragma once
#include <cublas_v2.h>

namespace kiln::cuda {

// The cuBLAS entry points the backend uses (names as exported by libcublas).
struct CublasApi {
  cublasStatus_t (*create)(cublasHandle_t*);
  cublasStatus_t (*destroy)(cublasHandle_t);
  cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
  cublasStatus_t (*set_workspace)(cublasHandle_t, void*, size_t);
  cublasStatus_t (*gemm_strided_batched_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t,
                                            int, int, int, const void*, const void*, cudaDataType,
                                            int, long long int, const void*, cudaDataType, int,
                                            long long int, const void*, void*, cudaDataType, int,
                                            long long int, int, cublasComputeType_t,
                                            cublasGemmAlgo_t);
  const char* (*status_name)(cublasStatus_t);
  const char* (*status_string)(cublasStatus_t);
};

// Loads cuBLAS once (thread-safe) and returns its entry points; throws
// kiln::Error("[cuda] ...") naming the library and dlerror() when it cannot.
const CublasApi& cublas();

}  // namespace kiln::cuda
