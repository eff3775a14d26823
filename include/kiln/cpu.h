// The CPU backend: SIMD kernels, a persistent thread pool, packed f32 GEMM.
#pragma once
#include <memory>

#include "kiln/backend.h"

namespace kiln {

class CpuBackend : public Backend {
 public:
  // n_threads <= 0: one per hardware thread.
  explicit CpuBackend(int n_threads = 0);
  ~CpuBackend() override;
  const char* name() const override { return "CPU"; }
  BufferType& buffer_type() override { return host_buffer_type(); }
  bool supports_op(const TensorNode* node) const override;
  // Every graph pass: its kernels take every node they make.
  bool supports_pass(GraphPass /*p*/) const override { return true; }
  using Backend::compute;
  void compute(std::span<TensorNode* const> nodes) override;
  int n_threads() const;
  void set_n_threads(int n);  // recreates the pool

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
