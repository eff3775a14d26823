// Copies and constants: COPY (any dtypes), FULL, RAND_MASK, and gather_f32 (a
// dense f32 copy of a strided operand, for matmul and conv).
//
// Elementwise kernels share one shape (common.cuh): one thread per output
// element (grid-stride), operands addressed through Idx (any byte strides, numpy
// broadcasting), so each element is computed by the same expression whatever the
// launch shape: results never depend on it. dst may alias a source (in place):
// an element is read before it is written, by the same thread.
#include <climits>
#include <cstring>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"
#include "kiln/ext/rng.h"

namespace kiln::cuda {
namespace {

// ------------------------------------------------------------------ copies
__global__ void k_copy(char* d, Idx di, const char* s, Idx si, DType dt, DType st, int64_t n) {
  const int es = dt == DType::f16 || dt == DType::bf16 ? 2 : 4;
  KILN_GRID_LOOP(i, n) {
    const char* sp = s + si.off(i);
    char* dp = d + di.off(i);
    if (dt == st) copy_elem(dp, sp, es);  // same dtype: the bits (i32 beyond 2^24 stays exact)
    else store_from_f32(dp, dt, load_as_f32(sp, st));
  }
}

__global__ void k_fill(char* d, Idx di, uint32_t bits, int es, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    char* p = d + di.off(i);
    if (es == 4) *reinterpret_cast<uint32_t*>(p) = bits;
    else *reinterpret_cast<uint16_t*>(p) = uint16_t(bits);
  }
}

__global__ void k_rand_mask(char* d, Idx di, uint64_t seed, const int32_t* seed_t, float p,
                            int64_t n) {
  if (seed_t) seed ^= uint64_t(int64_t(*seed_t));
  KILN_GRID_LOOP(i, n) atf(d, di.off(i)) = detail::rng_uniform(seed, uint64_t(i)) < p ? 1.0f : 0.0f;
}

__global__ void k_gather_f32(const char* s, DType t, Idx si, int64_t n, float* out) {
  KILN_GRID_LOOP(i, n) out[i] = load_as_f32(s + si.off(i), t);
}

}  // namespace

// The bits FULL/PAD store for value v in dtype t (as the CPU's store_f32).
uint32_t fill_bits(DType t, float v) {
  switch (t) {
    case DType::f32: {
      uint32_t b;
      std::memcpy(&b, &v, 4);
      return b;
    }
    case DType::f16: return f32_to_f16(v);
    case DType::bf16: return f32_to_bf16(v);
    case DType::i32: {
      int32_t i = !(v == v)            ? 0
                  : v >= 2147483648.0f ? INT_MAX
                  : v < -2147483648.0f ? INT_MIN
                                       : int32_t(v);
      uint32_t b;
      std::memcpy(&b, &i, 4);
      return b;
    }
    default: break;  // quantized: FULL and PAD refuse them
  }
  return 0;
}

void gather_f32(const char* src, DType t, const Idx& si, int64_t n, float* out, const Launch& L) {
  if (n == 0) return;
  k_gather_f32<<<grid_for(n), kThreads, 0, L.stream>>>(src, t, si, n, out);
  check_launch("gather_f32");
}

void gather_dense(const char* src, DType t, const Idx& si, const Shape& shape, char* out,
                  const Launch& L) {
  const int64_t n = shape.numel();
  if (n == 0) return;
  const int64_t es = int64_t(dtype_size(t));
  k_copy<<<grid_for(n), kThreads, 0, L.stream>>>(out, dense_idx(shape, es), src, si, t, t, n);
  check_launch("gather_dense");
}

void copy_ops(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  char* d = static_cast<char*>(dst->data);
  switch (dst->op) {
    case Op::COPY: {
      const TensorNode* src = dst->src[0];
      // dst has src's shape (any strides) or is contiguous with another shape
      // (a copy feeding a reshape): elements go in src's row-major order.
      const Idx di =
          dst->shape == src->shape ? idx_of(dst) : dense_idx(src->shape, int64_t(dst->elem_size()));
      k_copy<<<grid_for(n), kThreads, 0, L.stream>>>(d, di, static_cast<const char*>(src->data),
                                                     idx_of(src), dst->dtype, src->dtype,
                                                     src->numel());
      return check_launch("copy");
    }
    case Op::FULL:
      k_fill<<<grid_for(n), kThreads, 0, L.stream>>>(
          d, idx_of(dst), fill_bits(dst->dtype, prm::fill_value(dst)), int(dst->elem_size()), n);
      return check_launch("full");
    case Op::RAND_MASK: {
      const int32_t* seed_t =
          dst->n_src > 0 && dst->src[0] ? static_cast<const int32_t*>(dst->src[0]->data) : nullptr;
      k_rand_mask<<<grid_for(n), kThreads, 0, L.stream>>>(d, idx_of(dst), prm::rand_seed(dst),
                                                          seed_t, prm::rand_p(dst), n);
      return check_launch("rand_mask");
    }
    default: fail("cuda", "copy_ops got ", op_name(dst->op));
  }
}

OpKernel copy_kernel(Op op) {
  switch (op) {
    case Op::COPY:
    case Op::FULL: return {[](const TensorNode*) { return true; }, copy_ops};
    case Op::RAND_MASK:
      return {[](const TensorNode* n) {
                const TensorNode* s0 = n->n_src > 0 ? n->src[0] : nullptr;
                return n->dtype == DType::f32 && (!s0 || s0->dtype == DType::i32);
              },
              copy_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
