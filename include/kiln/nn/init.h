// Param initialisers (host side, deterministic for a seed on every platform).
// The tensor must have memory. Bounds follow torch.nn.init. The nn layers use
// these for their PyTorch-like default initialisation (kiln/nn.h).
#pragma once
#include <cstdint>

#include "kiln/tensor.h"

namespace kiln {

void init_uniform(Tensor t, float lo, float hi, uint64_t seed);
void init_normal(Tensor t, float mean, float stddev, uint64_t seed);
// U(-b, b) with b = gain * sqrt(3 / fan_in); gain sqrt(2) suits ReLU layers.
// fan_in: inputs per output (784 for a [784, 500] matmul weight, C*KH*KW for a conv).
void kaiming_uniform(Tensor t, int64_t fan_in, uint64_t seed, float gain = 1.41421356f);
// U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out)).
void xavier_uniform(Tensor t, int64_t fan_in, int64_t fan_out, uint64_t seed, float gain = 1.0f);

}  // namespace kiln
