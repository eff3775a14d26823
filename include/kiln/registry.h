// The backend registry: the backends this build of kiln can create, each with a
// name, a one-line description of the device, and a factory. Programs list them
// and pick one (or several, for kiln::Scheduler) by name:
//
//   for (const kiln::BackendInfo& b : kiln::backend_list())
//     std::printf("%-6s %s\n", b.name.c_str(), b.description.c_str());
//   std::unique_ptr<kiln::Backend> be = kiln::make_backend("blas", {.n_threads = 4});
//
// Built in: "cuda" (when kiln was built with CUDA, see KILN_HAVE_CUDA and
// kiln/cuda.h, and a device is present), "blas" (when kiln was built with
// OpenBLAS, see KILN_HAVE_BLAS and kiln/blas.h) and "cpu" (always). Names are
// matched case-insensitively. Adding a backend of one's own: kiln/ext/registry.h.
// backend_names() lists them in order of preference (accelerators first, "cpu"
// last), so make_backends(backend_names()) is a sensible default for a Scheduler.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/backend.h"

namespace kiln {

struct BackendOptions {
  int n_threads = 0;  // host threads a backend may use; <= 0: one per hardware thread
  // make_backends: when none of the named backends runs on the host ("cuda"
  // alone), add "cpu" last, so a Scheduler runs there the ops the accelerators
  // have no kernel for (what a user of `--backend cuda` expects).
  bool host_fallback = false;
  // "cuda": f32 matmuls on TF32 tensor cores (CudaOptions::allow_tf32; off by
  // default, as PyTorch's torch.backends.cuda.matmul.allow_tf32). Ignored by
  // the host backends.
  bool tf32 = false;
};

struct BackendInfo {
  std::string name;         // "cpu", "blas": what make_backend() takes
  std::string description;  // e.g. "AMD EPYC 7B13, 16 hardware threads"
  std::function<std::unique_ptr<Backend>(const BackendOptions&)> make;
};

// Every registered backend, most preferred first.
std::vector<BackendInfo> backend_list();
std::vector<std::string> backend_names();
bool has_backend(std::string_view name);

// A new backend by name. Throws kiln::Error "[make_backend] unknown backend 'x'
// (available: blas, cpu)" for names that are not registered; for "cuda" without
// a device the message says why ("... not available: no CUDA device found ...").
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& opt = {});
// Several backends from a list of names, or from one string "blas,cpu" (commas
// or spaces between names); keeps the order.
std::vector<std::unique_ptr<Backend>> make_backends(const std::vector<std::string>& names,
                                                    const BackendOptions& opt = {});
std::vector<std::unique_ptr<Backend>> make_backends(std::string_view names,
                                                    const BackendOptions& opt = {});

}  // namespace kiln
