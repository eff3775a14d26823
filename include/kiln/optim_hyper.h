// The optimizer steps' per-step values as typed structs (user API: programs
// fill them with kiln::adamw_hyper / sgd_hyper, kiln/opt.h, and write them into
// the step's hp tensor with hyper_values).
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kiln {

// ---- optimizer steps: the per-step values (ADAMW_STEP, SGD_STEP) ----
// These ops have no op parameters: every value they use may change between
// steps (a schedule's learning rate, the bias corrections, the gradient scale),
// and op parameters are fixed when the graph is built (docs/design.md,
// principle 2). Their last source is instead a small f32 tensor of
// hyper_floats<H> elements laid out as one of these structs and written on the
// host before each step, so one graph (or one captured CUDA graph) serves every
// step. Builders, kernels and the test reference all go through the struct:
// field names, never positions.
struct AdamWHyper {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0;
  float weight_decay = 0;      // decoupled: param *= 1 - lr * weight_decay
  float bias_correction1 = 1;  // 1 / (1 - beta1^t), t the 1-based step
  float bias_correction2 = 1;  // 1 / (1 - beta2^t)
  float grad_scale = 1;        // multiplies the gradient (1/batches, clipping factor)
};
struct SgdHyper {
  float lr = 0, momentum = 0, dampening = 0;
  float weight_decay = 0;  // L2: added to the gradient
  float nesterov = 0;      // 0 or 1
  float first_step = 0;    // 1: the momentum buffer starts as the gradient
  float grad_scale = 1;
};
// Rows a multi-tensor AdamW node's segment table may have (ADAMW_STEP_MULTI:
// the CUDA kernel keeps the table in shared memory); more params take more nodes.
inline constexpr int64_t kMaxAdamWSegments = 2048;
// Elements of H's tensor, and the index of its grad_scale element.
template <class H>
inline constexpr int64_t hyper_floats = int64_t(sizeof(H) / sizeof(float));
template <class H>
constexpr int64_t hyper_grad_scale_index() {
  return int64_t(offsetof(H, grad_scale) / sizeof(float));
}
// H as the tensor's values, and back (elements `stride` floats apart).
template <class H>
std::array<float, size_t(hyper_floats<H>)> hyper_values(const H& h) {
  static_assert(std::is_trivially_copyable_v<H> && sizeof(H) % sizeof(float) == 0);
  std::array<float, size_t(hyper_floats<H>)> v;
  std::memcpy(v.data(), &h, sizeof(H));
  return v;
}
template <class H>
H hyper_from_values(const float* v, int64_t stride = 1) {
  float packed[hyper_floats<H>];
  for (int64_t k = 0; k < hyper_floats<H>; ++k) packed[k] = v[k * stride];
  H h;
  std::memcpy(&h, packed, sizeof(H));
  return h;
}

}  // namespace kiln
