// The bf16 paths of ATTENTION and ATTENTION_BACK (attention_bf16.cpp): when q,
// k and v are bf16 and the build has AVX512_BF16, the products QK^T, PV, dO V^T,
// dS K, dS^T Q and P^T dO run on vdpbf16ps (pairs of bf16, f32 accumulation);
// softmax, its statistics and the gradients' sums stay f32. Each returns false
// where it does not apply, and the f32 kernels (attention_forward.cpp,
// attention.cpp) then run, converting bf16 rows to f32 (the portable and AVX2
// builds' bf16 path).
#pragma once
#include "backends/cpu/thread_pool.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

bool attention_bf16_forward(TensorNode* dst, ThreadCtx& t);
bool attention_bf16_backward(TensorNode* dst, ThreadCtx& t);

}  // namespace kiln::cpu
