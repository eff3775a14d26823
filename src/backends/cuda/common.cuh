// Device-side helpers shared by the CUDA kernel files: strided indexing,
// element loads/stores of every dtype (bit-exact with the CPU's conversions),
// grid-stride loops and a deterministic block reduction.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>

#include "backends/cuda/launch.h"
#include "kiln/dtype.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/tensor.h"

namespace kiln::cuda {

inline constexpr int kThreads = 256;  // threads per block of the elementwise kernels

// Blocks for n items with kThreads each, capped (the kernels loop grid-stride).
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t b = (n + threads - 1) / threads;
  return unsigned(std::clamp<int64_t>(b, 1, int64_t(1) << 20));
}

#define KILN_GRID_LOOP(i, n)                                                \
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += int64_t(gridDim.x) * blockDim.x)

// Linear (row-major) index over a shape -> byte offset with per-dim byte strides.
// `dense` > 0: the strides are the dense ones of that element size (fast path).
struct Idx {
  int nd = 0;
  int64_t dense = 0;
  int64_t size[kMaxDims] = {1, 1, 1, 1};
  int64_t stride[kMaxDims] = {0, 0, 0, 0};
  __host__ __device__ int64_t off(int64_t i) const {
    if (dense) return i * dense;
    int64_t o = 0;
    for (int d = nd - 1; d >= 0; --d) {
      o += (i % size[d]) * stride[d];
      i /= size[d];
    }
    return o;
  }
};

// Host-side builders.
inline Idx make_idx(const Shape& s, const int64_t* stride, int64_t esize) {
  Idx x;
  x.nd = s.ndim();
  int64_t want = esize;
  bool dense = true;
  for (int d = s.ndim() - 1; d >= 0; --d) {
    x.size[d] = s[d];
    x.stride[d] = stride[d];
    if (s[d] != 1 && stride[d] != want) dense = false;
    want *= s[d];
  }
  x.dense = dense ? esize : 0;
  return x;
}
// t with its own shape and strides.
inline Idx idx_of(const TensorNode* t) {
  return make_idx(t->shape, t->stride.data(), int64_t(t->elem_size()));
}
// t broadcast (numpy, right-aligned) to `out`: stretched and missing dims get stride 0.
inline Idx bcast_idx(const TensorNode* t, const Shape& out) {
  int64_t st[kMaxDims] = {};
  const int off = out.ndim() - t->shape.ndim();
  for (int d = 0; d < out.ndim(); ++d) {
    const int sd = d - off;
    if (sd >= 0) st[d] = (t->shape[sd] == 1 && out[d] != 1) ? 0 : t->stride[sd];
  }
  return make_idx(out, st, int64_t(t->elem_size()));
}
// Dense row-major strides of `s` for elements of esize bytes.
inline Idx dense_idx(const Shape& s, int64_t esize) {
  int64_t st[kMaxDims] = {};
  int64_t acc = esize;
  for (int d = s.ndim() - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return make_idx(s, st, esize);
}

// ---- element conversions, bit-exact with kiln/dtype.h and cpu/kernels/common.h
__device__ inline uint16_t to_bf16(float x) {
  uint32_t u = __float_as_uint(x);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
__device__ inline float from_bf16(uint16_t h) { return __uint_as_float(uint32_t(h) << 16); }
__device__ inline uint16_t to_f16(float x) { return __half_as_ushort(__float2half_rn(x)); }
__device__ inline float from_f16(uint16_t h) { return __half2float(__ushort_as_half(h)); }
// float -> int32: truncation toward zero, saturating, NaN -> 0.
__device__ inline int32_t to_i32(float x) {
  if (!(x == x)) return 0;
  if (x >= 2147483648.0f) return INT_MAX;
  if (x < -2147483648.0f) return INT_MIN;
  return int32_t(x);
}

__device__ inline float load_as_f32(const char* p, DType t) {
  switch (t) {
    case DType::f32: return *reinterpret_cast<const float*>(p);
    case DType::f16: return from_f16(*reinterpret_cast<const uint16_t*>(p));
    case DType::bf16: return from_bf16(*reinterpret_cast<const uint16_t*>(p));
    case DType::i32: return float(*reinterpret_cast<const int32_t*>(p));
    default: break;  // quantized: never element-wise (supported() refuses them)
  }
  return 0.0f;
}
__device__ inline void store_from_f32(char* p, DType t, float v) {
  switch (t) {
    case DType::f32: *reinterpret_cast<float*>(p) = v; break;
    case DType::f16: *reinterpret_cast<uint16_t*>(p) = to_f16(v); break;
    case DType::bf16: *reinterpret_cast<uint16_t*>(p) = to_bf16(v); break;
    case DType::i32: *reinterpret_cast<int32_t*>(p) = to_i32(v); break;
    default: break;  // quantized: never element-wise (supported() refuses them)
  }
}
// Copies one element of es (2 or 4) bytes.
__device__ inline void copy_elem(char* d, const char* s, int es) {
  if (es == 4) *reinterpret_cast<uint32_t*>(d) = *reinterpret_cast<const uint32_t*>(s);
  else *reinterpret_cast<uint16_t*>(d) = *reinterpret_cast<const uint16_t*>(s);
}

__device__ inline float ldf(const char* base, int64_t off) {
  return *reinterpret_cast<const float*>(base + off);
}
__device__ inline float& atf(char* base, int64_t off) {
  return *reinterpret_cast<float*>(base + off);
}
__device__ inline int32_t ldi(const char* base, int64_t off) {
  return *reinterpret_cast<const int32_t*>(base + off);
}

// NaN-propagating max (as torch.max and the CPU kernels).
__host__ __device__ inline float fmax_nan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

// Reduces v over the block (blockDim.x a multiple of 32, at most 1024) with a
// fixed shape of combining (warp shuffles, then the warps' results in order), so
// the result depends only on the values and blockDim. Every thread gets it.
// shm: 33 elements of shared memory.
template <class T, class Op>
__device__ T block_reduce(T v, T identity, Op op, T* shm) {
  const int lane = int(threadIdx.x) & 31, w = int(threadIdx.x) >> 5, nw = int(blockDim.x) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
  __syncthreads();  // a previous call may still read shm
  if (lane == 0) shm[w] = v;
  __syncthreads();
  if (w == 0) {
    v = lane < nw ? shm[lane] : identity;
    for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_down_sync(0xffffffffu, v, o));
    if (lane == 0) shm[32] = v;
  }
  __syncthreads();
  return shm[32];
}

struct SumOp {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct MaxNanOp {
  __device__ float operator()(float a, float b) const { return fmax_nan(a, b); }
};

// Records position `pos` as bad (the smallest one wins: order independent).
__device__ inline void report_bad(unsigned long long* err, int64_t pos) {
  if (err) atomicMin(err, static_cast<unsigned long long>(pos));
}

// out[i] = (float) element i of src (any dtype) at si.off(i), i < n: a dense f32
// copy of a strided or permuted operand (copy.cu).
void gather_f32(const char* src, DType t, const Idx& si, int64_t n, float* out, const Launch& L);
// The same in t's own dtype: a dense row-major copy of `shape` elements.
// The bits FULL and PAD store for value v in dtype t, as the CPU's store_f32
// (copy.cu; i32: NaN -> 0, saturating).
uint32_t fill_bits(DType t, float v);
void gather_dense(const char* src, DType t, const Idx& si, const Shape& shape, char* out,
                  const Launch& L);

}  // namespace kiln::cuda
