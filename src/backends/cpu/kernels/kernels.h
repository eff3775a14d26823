// CPU kernel declarations, generated from kiln/ops.def: every op of kind COMPUTE
// or ALIAS has `void kernel_<ENUM>(TensorNode* dst, ThreadCtx& t)`, defined in
// the kernels/ file of its family. A missing kernel is a link error.
//
// Contract: every thread of the pool calls the kernel with the same dst; the kernel
// splits its own work by t.ith / t.nth (it may call t.barrier(); all threads must
// then call it equally). The value of every output element must not depend on
// t.nth (fixed reduction order), so results are identical for any thread count.
// Inputs are dst->src[i] with arbitrary byte strides (views, broadcasts); dst is
// contiguous unless it is an ALIAS op. Errors in the data throw kiln::Error.
#pragma once
#include "backends/cpu/thread_pool.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::cpu {

#define KILN_KERNEL_LEAF(e)
#define KILN_KERNEL_VIEW(e)
#define KILN_KERNEL_ALIAS(e) void kernel_##e(TensorNode* dst, ThreadCtx& t);
#define KILN_KERNEL_COMPUTE(e) void kernel_##e(TensorNode* dst, ThreadCtx& t);
#define KILN_OP(e, family, kind, inplace, grad) KILN_KERNEL_##kind(e)
#include "kiln/ops.def"
#undef KILN_OP
#undef KILN_KERNEL_LEAF
#undef KILN_KERNEL_VIEW
#undef KILN_KERNEL_ALIAS
#undef KILN_KERNEL_COMPUTE

}  // namespace kiln::cpu
