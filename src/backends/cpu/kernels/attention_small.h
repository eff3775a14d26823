// The small-head paths of ATTENTION and ATTENTION_BACK (attention_small.cpp):
// when every head's query and key counts and E are small (a GPT-sized head, T
// and E <= 64), one thread computes whole heads with the head's score tile in
// L1, instead of the tiled, packed kernels built for long sequences. Each
// returns false where the shape does not qualify (the choice depends on the
// shape only, never on the thread count), and the caller runs its usual kernel.
#pragma once
#include "backends/cpu/thread_pool.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

bool attention_small_forward(TensorNode* dst, ThreadCtx& t);
bool attention_small_backward(TensorNode* dst, ThreadCtx& t);

}  // namespace kiln::cpu
