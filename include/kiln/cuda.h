// The CUDA backend: device memory (cudaMalloc) and kernels on one CUDA stream.
//
// Only in builds with the CUDA toolkit (CMake option KILN_CUDA, on when nvcc is
// found); those define KILN_HAVE_CUDA=1 for kiln and for programs linking kiln.
// This header needs no CUDA headers. The registry lists "cuda" only when a
// device is present (cuda_device_count() > 0):
//
//   #if KILN_HAVE_CUDA
//   if (kiln::cuda_device_count() > 0) {
//     kiln::CudaBackend gpu;             // device 0
//     kiln::CpuBackend cpu;
//     kiln::Scheduler sched({&gpu, &cpu});  // ops without a CUDA kernel run on the CPU
//   }
//   #endif
//
// Semantics the kernels keep (docs/cuda.md):
//   - every op of ops.def that supports_op() accepts gives the CPU backend's
//     result up to rounding (matmul runs through cuBLAS: another summation order);
//   - results are the same bits run to run: reductions use a fixed launch shape
//     and a fixed combining order, never float atomics;
//   - f32 matmul is full f32 unless CudaOptions::allow_tf32 (TF32 tensor cores:
//     10-bit mantissa inputs); f16/bf16 inputs accumulate in f32;
//   - index errors (embedding, one_hot, scatter_add_rows) are found on the device
//     and thrown as kiln::Error by compute(), after the stream has finished.
//
// Memory and ordering: Buffer::set/get/memset use the legacy default stream,
// which waits for the backend's (blocking) stream, so reading a result after
// compute() needs no explicit synchronize(). compute() itself is asynchronous
// unless the node list contains an index-checking op.
//
// CUDA graphs: compute() on a node list it has seen before (same nodes, same
// memory, same params) captures the launches once and replays them afterwards;
// values that change per step (inputs, optimizer hyper-parameters, seeds) are
// tensor data, read by the kernels at run time, so a replay sees them.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/backend.h"

namespace kiln {

struct CudaOptions {
  int device = 0;
  // f32 matmul on TF32 tensor cores (faster, ~1e-3 relative error). Off: full f32.
  bool allow_tf32 = false;
  // Capture repeated node lists as CUDA graphs and replay them.
  bool graphs = true;
  // Node lists kept as CUDA graphs (least recently used dropped beyond it). A
  // step the scheduler splits around CPU-only ops is one list per CUDA split;
  // with fewer entries than that nothing would replay (Stats::evictions grows).
  int max_graphs = 256;
  // Times every node on the GPU (CUDA events around each launch; graphs off,
  // so the times include no replay savings) and sums them per op, dtype and
  // shape: profile_report() has the table, and the backend prints it to
  // stderr when destroyed. The environment variable KILN_CUDA_PROFILE=1 turns
  // it on for every CudaBackend (e.g. `KILN_CUDA_PROFILE=1 kiln-gpt train
  // --backend cuda ...`).
  bool profile = false;
};

class CudaBackend : public Backend {
 public:
  // Throws kiln::Error "[cuda] ..." when the device cannot be used.
  explicit CudaBackend(CudaOptions opt = {});
  ~CudaBackend() override;
  const char* name() const override { return "CUDA"; }
  BufferType& buffer_type() override;
  bool supports_op(const TensorNode* node) const override { return supports(node); }
  // No graph pass yet (no bf16 stores, no fused bias). Issue 44 turns on
  // GraphPass::fuse_bias and fuse_residual here once the kernels take them.
  bool supports_pass(GraphPass /*p*/) const override { return false; }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override;
  void synchronize() override;
  const CudaOptions& options() const;

  // What supports_op() answers; needs no device (tests, tools).
  static bool supports(const TensorNode* node);

  // Counters of compute() calls, for tests and benchmarks.
  struct Stats {
    int64_t eager = 0;      // node lists launched kernel by kernel
    int64_t captures = 0;   // node lists captured into a CUDA graph
    int64_t replays = 0;    // launches of a captured graph (the capturing run included)
    int64_t evictions = 0;  // node lists dropped from the graph cache (max_graphs)
  };
  Stats stats() const;
  // With CudaOptions::profile: GPU milliseconds per (op, dtype, shape), most
  // first: "ms  calls  ms/call  op dtype shape" lines. Empty otherwise.
  std::string profile_report() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Devices visible to the CUDA runtime; 0 when there are none or no driver.
int cuda_device_count();
// Why there is no usable device ("no CUDA driver (cudaErrorInsufficientDriver)"),
// or "" when there is one.
std::string cuda_unavailable_reason();
// "NVIDIA H100 80GB HBM3 (sm_90, 79.1 GiB), CUDA runtime 13.0" for a device.
std::string cuda_description(int device = 0);

}  // namespace kiln
