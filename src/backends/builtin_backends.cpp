// The backends this build of kiln has, for the registry (kiln/registry.h): "cuda"
// (when built with CUDA and a device is present), "blas" (when built with
// OpenBLAS), then "cpu": the order of preference.
#include <fstream>
#include <string>

#include "backends/cpu/thread_pool.h"
#include "kiln/cpu.h"
#include "kiln/ext/registry.h"
#if KILN_HAVE_BLAS
#include "kiln/blas.h"
#endif
#if KILN_HAVE_CUDA
#include "kiln/cuda.h"
#include "kiln/ext/tensor_node.h"
#endif

namespace kiln::detail {

namespace {

// "model name" from /proc/cpuinfo (Linux); empty elsewhere.
std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    size_t b = line.find_first_not_of(" \t", colon + 1);
    return b == std::string::npos ? std::string() : line.substr(b);
  }
  return {};
}

std::string cpu_description() {
  std::string model = cpu_model();
  if (model.empty()) model = "CPU";
  return model + ", " + std::to_string(cpu::default_thread_count()) + " hardware threads";
}

}  // namespace

std::vector<BackendInfo> builtin_backends() {
  std::vector<BackendInfo> list;
#if KILN_HAVE_CUDA
  // Listed only with a device: without one (or without a driver) "cuda" is not
  // available, and make_backend("cuda") says why (builtin_unavailable_reason).
  if (cuda_device_count() > 0)
    list.push_back(
        {"cuda", cuda_description(0), [](const BackendOptions& o) -> std::unique_ptr<Backend> {
           return std::make_unique<CudaBackend>(CudaOptions{.allow_tf32 = o.tf32});
         }});
#endif
#if KILN_HAVE_BLAS
  list.push_back(
      {"blas", blas_description(), [](const BackendOptions& o) -> std::unique_ptr<Backend> {
         return std::make_unique<BlasBackend>(o.n_threads, /*cpu_kernels=*/true);
       }});
#endif
  list.push_back(
      {"cpu", cpu_description(), [](const BackendOptions& o) -> std::unique_ptr<Backend> {
         return std::make_unique<CpuBackend>(o.n_threads);
       }});
  return list;
}

std::string builtin_unavailable_reason(std::string_view name) {
  if (name == "cuda") {
#if KILN_HAVE_CUDA
    return cuda_unavailable_reason();
#else
    return "this kiln was built without CUDA (CMake option KILN_CUDA, on when nvcc is found)";
#endif
  }
#if !KILN_HAVE_BLAS
  if (name == "blas") return "this kiln was built without OpenBLAS (CMake option KILN_BLAS)";
#endif
  return "";
}

}  // namespace kiln::detail
