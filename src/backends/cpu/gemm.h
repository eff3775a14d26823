// kiln::cpu::gemm: C (+)= A @ B in f32, with A and B f32, f16 or bf16 strided
// views. BLIS-style blocked, packed GEMM (gemm.cpp: driver; gemm_pack*.cpp:
// packing with type conversion; gemm_kernel_*.cpp: micro-kernels).
#pragma once
#include <cstdint>

#include "backends/cpu/thread_pool.h"

namespace kiln::cpu {

enum class GemmType { f32, f16, bf16 };  // element type of A or B (C is always f32)

// A strided 2-D matrix view; element (i, j) is at data[i*rs + j*cs] (strides in
// elements, any sign or value: a transposed view is rs = 1, cs = ld).
// round_bf16 (f32 only): each element is read rounded to bf16 (nearest even,
// subnormals as zero: gemm_convert.h's f32_to_bf16_daz), so the product is the
// one over a bf16 copy without the copy (the blocked paths pack the rounded
// values directly; the unpacked small-M / small-N paths round into a private
// copy first).
struct GemmOperand {
  const void* data;
  GemmType type;
  int64_t rs, cs;
  bool round_bf16 = false;
};

struct GemmArgs {
  int64_t M, N, K;
  GemmOperand A;  // M x K
  GemmOperand B;  // K x N
  float* C;       // M x N, C(i, j) at C[i*ldc + j]
  int64_t ldc;
  bool accumulate = false;  // C += A@B instead of C = A@B
  // Optional, N floats: added to every row of C last, C = (A@B [+ C]) + bias,
  // each add rounded as a separate add pass would (a Linear's bias, folded in
  // while the C tile is still in cache).
  const float* bias = nullptr;
  // Optional: C is bf16 here instead (C(i, j) at C_bf16[i*ldc + j]; `C` unused,
  // no accumulate): each element computed in f32 as above, then rounded to
  // nearest even as a COPY to bf16 rounds (a cast folded into its MATMUL by
  // Graph::fuse_bf16_casts). The blocked paths round each C tile from L1.
  uint16_t* C_bf16 = nullptr;
};

// Called by every thread of a pool run, with the same args on all threads (a
// standalone ThreadCtx computes everything on the calling thread). Work is
// split over M/N tiles only, never over K, so every element of C is computed by
// the same sequence of operations for any thread count: results are
// bit-identical for any nth. Contains barriers (all threads must call it
// together); when it returns on any thread, all of C is written. Uses
// t.scratch() and t.shared_scratch() for the packing buffers. C must not
// overlap A or B. Small products (< 2^18 multiply-adds) run on thread 0 alone.
void gemm(const GemmArgs& args, ThreadCtx& t);

// x (rows x cols, f32 with round_bf16) rounded into a bf16 copy with x's
// strides, in thread-local buffer `slot` (0 or 1), valid until this thread's
// next call with that slot.
GemmOperand rounded_bf16_copy(const GemmOperand& x, int64_t rows, int64_t cols, int slot);

// gemm computed by the calling thread alone, on a thread-local context (its own
// packing buffers, no barriers): for kernels that deal whole products to threads.
void gemm_alone(const GemmArgs& args);

}  // namespace kiln::cpu
