// Shared helpers for CPU kernels (namespace kiln::cpu). Everything here is
// header-only except binary_f32 (binary.cpp).
//
// Work splitting
//   thread_range(t, n, cost, align)  the slice of [0, n) thread t handles. Small
//       jobs (n * cost < kMinWorkPerThread) go to thread 0 alone, larger ones to
//       as many threads as have kMinWorkPerThread each; the others get an empty
//       range and may return at once (no barrier needed).
//   split_range(n, ith, nth, align) / useful_threads(n, nth, cost) are the
//   pieces, for kernels that split something else (rows, blocks, batches).
//   Kernels whose per-element result does not depend on the split (elementwise
//   ops, per-row reductions) need nothing else to be deterministic.
//
// Strided / broadcast iteration
//   bcast_strides(t, shape)  t's byte strides seen at `shape` (numpy rules).
//   make_layout<N>(shape, {strides...})  N operands over one index space, with
//       dims merged where every operand is contiguous across them and size-1
//       dims dropped: a contiguous tensor becomes one long row.
//   for_each_run(layout, base, begin, end, fn)  walks the linear (row-major)
//       index range [begin, end) as runs along the innermost dim and calls
//       fn(ptr, n, step): ptr[k] = operand k's first element, step[k] = its byte
//       step. Test step[k] == elem size for the fast path, 0 for a broadcast.
//
// Element types
//   load_f32 / store_f32      one element of any dtype as float (i32 converts;
//       float -> i32 truncates toward zero, saturates, NaN -> 0).
//   convert(src, st, sstep, dst, dt, dstep, n)  n elements, any dtypes and
//       byte steps; contiguous f32<->f16/bf16 and i32<->f32 are vectorised
//       (F16C / AVX-512F). f16 uses the hardware conversion where available.
//   f32_row(p, t, step, n, buf)  a contiguous f32 view of a row: p itself when
//       it already is one, else the row converted into buf (>= n floats).
//
// Dense maps
//   map_dense(d, n, stream, f)  d[i..i+m) = f(i, m) in vectors (masked tail);
//       load_lanes(p, i, m) reads an input; stream = non-temporal stores, for
//       outputs of at least stream_threshold_bytes().
//
// Reductions
//   sum_f32(p, n)  deterministic, accurate sum of a contiguous f32 row (blocks of
//       kSumBlock summed with 4x vector accumulators, blocks added in double).
//
// Shared ops
//   binary_f32(op, dst, a, b, t)  dst = a (+ - * /) b with broadcasting, any
//       strides (binary.cpp): bias adds, residuals, ACCUMULATE.
//
// Math: vec_math.h (exp, log, tanh, erf, ... over the vector types of simd.h).
#pragma once
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "backends/cpu/kernels/vec_math.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"
#include "kiln/ext/op_params.h"
#include "kiln/tensor.h"

#if defined(__AVX512F__) || defined(__F16C__) || defined(__AVX2__)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu {

using Strides = std::array<int64_t, kMaxDims>;

// ---------------------------------------------------------------- splitting
inline constexpr int64_t kMinWorkPerThread = 16384;  // ~elements of a cheap op

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
  bool empty() const { return end <= begin; }
};

// Thread ith's part of [0, n) split over nth threads in contiguous blocks whose
// boundaries are multiples of `align`.
inline Range split_range(int64_t n, int ith, int nth, int64_t align = 1) {
  if (nth <= 1) return {0, n};
  int64_t blocks = (n + align - 1) / align;
  int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
  return {std::min(n, b0 * align), std::min(n, b1 * align)};
}

// Threads worth using for n items of `cost` each (at least 1, at most nth).
inline int useful_threads(int64_t n, int nth, int64_t cost = 1) {
  int64_t work = n * cost;
  int64_t k = work / kMinWorkPerThread;
  return int(std::clamp<int64_t>(k, 1, nth));
}

inline Range thread_range(const ThreadCtx& t, int64_t n, int64_t cost = 1, int64_t align = 16) {
  int k = useful_threads(n, t.nth, cost);
  if (t.ith >= k) return {0, 0};
  return split_range(n, t.ith, k, align);
}

// ---------------------------------------------------------------- layouts
// Row-major byte strides of a dense tensor of `s`.
inline Strides dense_strides(const Shape& s, int64_t esize) {
  Strides st{};
  int64_t acc = esize;
  for (int d = s.ndim() - 1; d >= 0; --d) {
    st[d] = acc;
    acc *= s[d];
  }
  return st;
}

// t's byte strides when broadcast to `out` (t right-aligned against out;
// size-1 dims of t that out stretches, and missing leading dims, get 0).
inline Strides bcast_strides(const TensorNode* t, const Shape& out) {
  Strides st{};
  int off = out.ndim() - t->shape.ndim();
  for (int d = 0; d < out.ndim(); ++d) {
    int sd = d - off;
    if (sd < 0) continue;
    st[d] = (t->shape[sd] == 1 && out[d] != 1) ? 0 : t->stride[sd];
  }
  return st;
}

template <int N>
struct Layout {
  int nd = 1;
  int64_t size[kMaxDims] = {1, 1, 1, 1};
  int64_t stride[N][kMaxDims] = {};  // [operand][dim], bytes
  int64_t inner() const { return size[nd - 1]; }
  // True when every operand's innermost step equals its element size.
  bool inner_dense(const std::array<int64_t, N>& esize) const {
    for (int k = 0; k < N; ++k)
      if (stride[k][nd - 1] != esize[k]) return false;
    return true;
  }
};

template <int N>
Layout<N> make_layout(const Shape& shape, const std::array<Strides, N>& st) {
  Layout<N> L;
  int n = 0;  // dims collected so far, innermost first
  int64_t size[kMaxDims];
  int64_t str[N][kMaxDims];
  for (int d = shape.ndim() - 1; d >= 0; --d) {
    if (shape[d] == 1) continue;
    bool merge = n > 0;
    for (int k = 0; k < N && merge; ++k) merge = st[k][d] == str[k][n - 1] * size[n - 1];
    if (merge) {
      size[n - 1] *= shape[d];
    } else {
      size[n] = shape[d];
      for (int k = 0; k < N; ++k) str[k][n] = st[k][d];
      ++n;
    }
  }
  if (n == 0) {  // a single element
    L.nd = 1;
    L.size[0] = shape.numel() == 0 ? 0 : 1;
    for (int k = 0; k < N; ++k) L.stride[k][0] = 0;
    return L;
  }
  L.nd = n;
  for (int i = 0; i < n; ++i) {
    L.size[n - 1 - i] = size[i];
    for (int k = 0; k < N; ++k) L.stride[k][n - 1 - i] = str[k][i];
  }
  return L;
}

template <int N>
using Ptrs = std::array<char*, N>;
template <int N>
using Steps = std::array<int64_t, N>;

template <int N, class Fn>
void for_each_run(const Layout<N>& L, const Ptrs<N>& base, int64_t begin, int64_t end, Fn&& fn) {
  if (begin >= end) return;
  const int nd = L.nd;
  const int64_t inner = L.size[nd - 1];
  Steps<N> step;
  for (int k = 0; k < N; ++k) step[k] = L.stride[k][nd - 1];
  int64_t idx[kMaxDims] = {};
  int64_t rem = begin / inner, i0 = begin % inner;
  for (int d = nd - 2; d >= 0; --d) {
    idx[d] = rem % L.size[d];
    rem /= L.size[d];
  }
  Ptrs<N> p = base;
  for (int k = 0; k < N; ++k)
    for (int d = 0; d < nd - 1; ++d) p[k] += idx[d] * L.stride[k][d];
  int64_t left = end - begin;
  for (;;) {
    int64_t n = std::min(inner - i0, left);
    Ptrs<N> q;
    for (int k = 0; k < N; ++k) q[k] = p[k] + i0 * step[k];
    fn(q, n, step);
    left -= n;
    if (left <= 0) break;
    i0 = 0;
    for (int d = nd - 2; d >= 0; --d) {  // next row
      for (int k = 0; k < N; ++k) p[k] += L.stride[k][d];
      if (++idx[d] < L.size[d]) break;
      for (int k = 0; k < N; ++k) p[k] -= L.stride[k][d] * L.size[d];
      idx[d] = 0;
    }
  }
}

// ---------------------------------------------------------------- conversions
inline float half_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  return f16_to_f32(h);
#endif
}
inline uint16_t f32_to_half(float x) {
#if defined(__F16C__)
  return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT);
#else
  return f32_to_f16(x);
#endif
}
// float -> int32: truncation toward zero, saturating, NaN -> 0.
inline int32_t f32_to_i32(float x) {
  if (!(x == x)) return 0;
  if (x >= 2147483648.0f) return INT32_MAX;
  if (x < -2147483648.0f) return INT32_MIN;
  return int32_t(x);
}

inline float load_f32(const void* p, DType t) {
  switch (t) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return half_to_f32(h);
    }
    case DType::bf16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return bf16_to_f32(h);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return float(v);
    }
    default: break;  // quantized: no element-wise access, ops refuse quantized tensors
  }
  return 0.0f;
}
inline void store_f32(void* p, DType t, float v) {
  switch (t) {
    case DType::f32: std::memcpy(p, &v, 4); break;
    case DType::f16: {
      uint16_t h = f32_to_half(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::bf16: {
      uint16_t h = f32_to_bf16(v);
      std::memcpy(p, &h, 2);
      break;
    }
    case DType::i32: {
      int32_t i = f32_to_i32(v);
      std::memcpy(p, &i, 4);
      break;
    }
    default: break;  // quantized: no element-wise access, ops refuse quantized tensors
  }
}

// Contiguous bulk conversions; vector bodies with scalar tails that agree bit
// for bit with load_f32/store_f32.
inline void f16_to_f32_n(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(s + i))));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i*)(s + i))));
#endif
  for (; i < n; ++i) d[i] = half_to_f32(s[i]);
}
inline void f32_to_f16_n(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16)
    _mm256_storeu_si256((__m256i*)(d + i),
                        _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128((__m128i*)(d + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
  for (; i < n; ++i) d[i] = f32_to_half(s[i]);
}
inline void bf16_to_f32_n(const uint16_t* s, float* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= n; i += 16) {
    __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i*)(s + i)));
    _mm512_storeu_si512(d + i, _mm512_slli_epi32(w, 16));
  }
#elif defined(__AVX2__)
  for (; i + 8 <= n; i += 8) {
    __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i*)(s + i)));
    _mm256_storeu_si256((__m256i*)(d + i), _mm256_slli_epi32(w, 16));
  }
#endif
  for (; i < n; ++i) d[i] = bf16_to_f32(s[i]);
}
inline void f32_to_bf16_n(const float* s, uint16_t* d, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // Round to nearest even on the bits (as f32_to_bf16); NaN -> quiet NaN.
  const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
  for (; i + 16 <= n; i += 16) {
    __m512i u = _mm512_loadu_si512(s + i);
    __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, abs_mask), inf);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    __m512i q = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    r = _mm512_mask_blend_epi32(nan, r, q);
    _mm256_storeu_si256((__m256i*)(d + i), _mm512_cvtepi32_epi16(r));
  }
#elif defined(__AVX2__)
  const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
  for (; i + 8 <= n; i += 8) {
    __m256i u = _mm256_loadu_si256((const __m256i*)(s + i));
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    __m256i q = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    r = _mm256_blendv_epi8(r, q, nan);  // 0..0xffff each: packus keeps them
    _mm_storeu_si128((__m128i*)(d + i),
                     _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
  }
#endif
  for (; i < n; ++i) d[i] = f32_to_bf16(s[i]);
}
inline void i32_to_f32_n(const int32_t* s, float* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = float(s[i]);
}
inline void f32_to_i32_n(const float* s, int32_t* d, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = f32_to_i32(s[i]);
}

// n elements from (src, st, byte step ss) to (dst, dt, byte step ds).
inline void convert(const char* src, DType st, int64_t ss, char* dst, DType dt, int64_t ds,
                    int64_t n) {
  const int64_t es = int64_t(dtype_size(st)), ed = int64_t(dtype_size(dt));
  if (st == dt) {
    if (ss == es && ds == ed) {
      std::memmove(dst, src, size_t(n * es));
    } else if (es == 4) {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, 4);
    } else {
      for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, 2);
    }
    return;
  }
  if (ss == es && ds == ed) {
    if (st == DType::f32) {
      const float* s = (const float*)src;
      switch (dt) {
        case DType::f16: return f32_to_f16_n(s, (uint16_t*)dst, n);
        case DType::bf16: return f32_to_bf16_n(s, (uint16_t*)dst, n);
        case DType::i32: return f32_to_i32_n(s, (int32_t*)dst, n);
        default: break;
      }
    } else if (dt == DType::f32) {
      float* d = (float*)dst;
      switch (st) {
        case DType::f16: return f16_to_f32_n((const uint16_t*)src, d, n);
        case DType::bf16: return bf16_to_f32_n((const uint16_t*)src, d, n);
        case DType::i32: return i32_to_f32_n((const int32_t*)src, d, n);
        default: break;
      }
    }
  }
  for (int64_t i = 0; i < n; ++i) store_f32(dst + i * ds, dt, load_f32(src + i * ss, st));
}

// A contiguous f32 row of n elements starting at p (dtype t, byte step): p itself
// when it already is one, else converted into buf (room for n floats).
inline const float* f32_row(const char* p, DType t, int64_t step, int64_t n, float* buf) {
  if (t == DType::f32 && (step == 4 || n <= 1)) return (const float*)p;
  convert(p, t, step, (char*)buf, DType::f32, 4, n);
  return buf;
}

// ---------------------------------------------------------------- dense maps
// Outputs at least this large (bytes) are written with non-temporal stores:
// they cannot stay in a typical last-level cache (32 MiB per CCD / desktop die)
// anyway, and streaming skips the read-for-ownership of every destination line
// (a quarter to a third less memory traffic for elementwise ops). A fixed value:
// sysconf's L3 size is unreliable in VMs (it may report the whole host's).
inline constexpr int64_t kStreamBytes = int64_t(32) << 20;
inline int64_t stream_threshold_bytes() { return kStreamBytes; }

// Vector i of a dense row p: m valid lanes (the rest read as 0), m == kW full.
inline vm::VF load_lanes(const float* p, int64_t i, int m) {
  return m == vm::kW ? vm::loadv<vm::VF>(p + i) : vm::loadv<vm::VF>(p + i, m);
}

// d[i..i+m) = f(i, m) over [0, n) in vectors of kW lanes (f returns a VF of which
// the first m lanes are stored). Every element goes through the same vector
// code whatever n and d's alignment, so results never depend on the split.
// `stream`: non-temporal stores for the aligned body (stream_threshold_bytes).
template <class F>
inline void map_dense(float* d, int64_t n, bool stream, F f) {
  constexpr int W = vm::kW;
  int64_t i = 0;
  if (stream && W > 1) {
    const int64_t mis = int64_t(reinterpret_cast<uintptr_t>(d) / sizeof(float)) % W;
    const int64_t head = std::min<int64_t>(n, mis ? W - mis : 0);
    if (head > 0) vm::store(d, f(int64_t(0), int(head)), int(head));
    for (i = head; i + W <= n; i += W) vm::stream(d + i, f(i, W));
    vm::stream_fence();
  } else {
    for (; i + 2 * W <= n; i += 2 * W) {
      vm::VF v0 = f(i, W), v1 = f(i + W, W);
      vm::store(d + i, v0);
      vm::store(d + i + W, v1);
    }
  }
  for (; i < n; i += W) {
    const int m = int(std::min<int64_t>(W, n - i));
    vm::store(d + i, f(i, m), m);
  }
}

// ---------------------------------------------------------------- sums
inline constexpr int64_t kSumBlock = 4096;

// Sum of n <= kSumBlock contiguous floats: four vector accumulators in a fixed
// pattern, so the result depends only on the data and n.
inline float sum_block_f32(const float* p, int64_t n) {
  using vm::VF;
  constexpr int W = vm::kW;
  VF a0 = vm::c<VF>(0.0f), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 4 * W <= n; i += 4 * W) {
    a0 = a0 + vm::loadv<VF>(p + i);
    a1 = a1 + vm::loadv<VF>(p + i + W);
    a2 = a2 + vm::loadv<VF>(p + i + 2 * W);
    a3 = a3 + vm::loadv<VF>(p + i + 3 * W);
  }
  for (; i + W <= n; i += W) a0 = a0 + vm::loadv<VF>(p + i);
  if (i < n) a1 = a1 + vm::loadv<VF>(p + i, int(n - i));
  return vm::hsum((a0 + a1) + (a2 + a3));
}

// Deterministic sum of n contiguous floats (blocks of kSumBlock, in double).
inline double sum_f32(const float* p, int64_t n) {
  double acc = 0.0;
  for (int64_t i = 0; i < n; i += kSumBlock)
    acc += sum_block_f32(p + i, std::min(kSumBlock, n - i));
  return acc;
}

// ---------------------------------------------------------------- shared ops
// dst = a (op) b elementwise over dst's shape; a and b broadcast to it (numpy),
// any byte strides, f32; dst may alias a or b element for element. Splits its
// work over t's threads (thread_range). Defined in binary.cpp; used by
// ACCUMULATE and usable by other kernels (bias adds, residuals).
enum class BinaryOp : uint8_t { add, sub, mul, div };
void binary_f32(BinaryOp op, TensorNode* dst, const TensorNode* a, const TensorNode* b,
                ThreadCtx& t);

}  // namespace kiln::cpu
