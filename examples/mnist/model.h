// The two MNIST models of kiln-mnist, the same as ggml's MNIST example, as
// kiln::nn modules (PyTorch's default init, params named fc1.weight, ...):
//   fc:  784 -> 500 (ReLU) -> 10
//   cnn: conv 3x3 1->8 pad 1, ReLU, max-pool 2; conv 3x3 8->16 pad 1, ReLU,
//        max-pool 2; dense 784 -> 10
// Each is built in its own Context for a fixed physical batch. This is the one
// definition of kiln's MNIST models: kiln-mnist, bench/bench_train.cpp,
// bench/bench_cuda.cpp and tests/cuda/cuda_models.h all build it in.
#pragma once
#include <memory>
#include <string>

#include "kiln/kiln.h"

namespace mnist {

struct Model {
  std::string kind;  // "fc" or "cnn"
  std::unique_ptr<kiln::Context> ctx = std::make_unique<kiln::Context>();
  std::unique_ptr<kiln::nn::Module> net;
  kiln::Tensor images;  // input: f32 [B, 784] (fc) or [B, 1, 28, 28] (cnn)
  kiln::Tensor logits;  // [B, 10]

  // Throws kiln::Error for an unknown kind. precision: the context's matmul
  // precision (f32, or bf16 for mixed precision; kiln/context.h).
  static Model build(const std::string& kind, int64_t batch, kiln::DType precision = kiln::f32);
};

}  // namespace mnist
