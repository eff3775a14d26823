// dlopen of cuBLAS (why: cublas_api.h).
#include "backends/cuda/cublas_api.h"

#include <dlfcn.h>

#include <string>

#include "kiln/error.h"

namespace kiln::cuda {

namespace {

// The soname of the cuBLAS these headers belong to, then the toolkit's copy by
// full path (an installed program has no RUNPATH to the toolkit).
void* open_cublas(std::string* tried) {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  std::string names[] = {soname,
#ifdef KILN_CUDA_LIBRARY_DIR
                         std::string(KILN_CUDA_LIBRARY_DIR) + "/" + soname
#endif
  };
  for (const std::string& name : names) {
    if (name.empty()) continue;
    if (void* h = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL)) return h;
    const char* err = dlerror();
    *tried += "\n  " + name + ": " + (err ? err : "not found");
  }
  return nullptr;
}

template <class F>
void resolve(void* lib, const char* symbol, F* out) {
  void* p = dlsym(lib, symbol);
  if (!p)
    fail("cuda", "cuBLAS has no symbol ", symbol,
         " (a cuBLAS older than the headers kiln was built with?)");
  *out = reinterpret_cast<F>(p);
}

CublasApi load() {
  std::string tried;
  void* lib = open_cublas(&tried);
  if (!lib) fail("cuda", "cannot load cuBLAS (the CUDA backend's matrix products); tried:", tried);
  CublasApi api{};
  resolve(lib, "cublasCreate_v2", &api.create);
  resolve(lib, "cublasDestroy_v2", &api.destroy);
  resolve(lib, "cublasSetStream_v2", &api.set_stream);
  resolve(lib, "cublasSetWorkspace_v2", &api.set_workspace);
  resolve(lib, "cublasGemmStridedBatchedEx", &api.gemm_strided_batched_ex);
  resolve(lib, "cublasGetStatusName", &api.status_name);
  resolve(lib, "cublasGetStatusString", &api.status_string);
  return api;  // the library stays loaded for the life of the process
}

}  // namespace

const CublasApi& cublas() {
  static const CublasApi api = load();  // a failed load throws and is retried next call
  return api;
}

}  // namespace kiln::cuda
