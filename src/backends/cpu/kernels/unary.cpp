// Elementwise unary kernels: NEG ABS SIGN SQR SQRT RSQRT EXP LOG SIN COS POW SCALE
// CLAMP RELU LEAKY_RELU GELU GELU_ERF ERF SILU SIGMOID TANH SOFTPLUS, and the
// fused gradients GELU_BACK GELU_ERF_BACK (dy * f'(x), two same-shape sources).
//
// Each op is one generic lambda over vm::VF / vm::SF (vec_math.h), run in its
// vector form on every layout (masked tail, so every element goes through the
// same code for any thread split; strided and bf16 runs through small buffers,
// see kChunk). dst may be src0 itself (in place): element i is read before it
// is written. Transcendental ops count as `cost` cheap elements when deciding
// how many threads a tensor is worth.
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {
namespace {

using vm::VF;

// Runs that are not dense f32 (strided views, a bf16 operand: a cast fused
// into the op or a bf16 source, both made by the CPU graph rewrites
// Graph::fuse_bf16_casts and bf16_gelu_inputs) go through f32 buffers of
// kChunk elements: sources gathered or widened exactly, the values computed by
// the same vector code as dense runs, then scattered or stored with the cast's
// own rounding. So every element of every layout and dtype is computed by one
// operation sequence: a bf16 dst holds exactly what a COPY to bf16 would, a
// bf16 source gives what the f32 op gives on its widened values, and a view
// gives what a contiguous copy gives, bit for bit on every ISA. (A scalar loop
// for strided runs would not: the scalar and vector forms may differ in the
// last bit where the compiler contracts a*b+c differently, and GELU's
// derivative amplifies that ~100-fold near its zero at x = -0.75.)
constexpr int64_t kChunk = 256;

// Elements [i0, i0 + m) of a run at byte step `step` as contiguous f32: the
// run itself when it is dense f32, else widened or gathered into buf.
const float* f32_chunk(const char* p, int64_t step, bool bf16, int64_t i0, int64_t m, float* buf) {
  if (!bf16) {
    if (step == 4) return reinterpret_cast<const float*>(p) + i0;
    for (int64_t i = 0; i < m; ++i) std::memcpy(&buf[i], p + (i0 + i) * step, sizeof(float));
    return buf;
  }
  if (step == 2) {
    bf16_to_f32_n(reinterpret_cast<const uint16_t*>(p) + i0, buf, m);
    return buf;
  }
  for (int64_t i = 0; i < m; ++i) {
    uint16_t h;
    std::memcpy(&h, p + (i0 + i) * step, sizeof h);
    buf[i] = bf16_to_f32(h);
  }
  return buf;
}

// Stores the f32 values v[0, m) as dst elements [i0, i0 + m) at byte step sd.
void store_chunk(char* d, int64_t sd, bool bf16, int64_t i0, int64_t m, const float* v) {
  if (bf16) {
    if (sd == 2) return f32_to_bf16_n(v, reinterpret_cast<uint16_t*>(d) + i0, m);
    for (int64_t i = 0; i < m; ++i) {
      const uint16_t h = f32_to_bf16(v[i]);
      std::memcpy(d + (i0 + i) * sd, &h, sizeof h);
    }
    return;
  }
  if (sd == 4 && reinterpret_cast<const float*>(d) + i0 == v) return;  // computed in place
  for (int64_t i = 0; i < m; ++i) std::memcpy(d + (i0 + i) * sd, &v[i], sizeof(float));
}

// The f32 buffer a chunk's results go to: dst itself when it is dense f32.
float* out_chunk(char* d, int64_t sd, bool bf16, int64_t i0, float* buf) {
  return !bf16 && sd == 4 ? reinterpret_cast<float*>(d) + i0 : buf;
}

template <class F>
void run_unary(TensorNode* dst, ThreadCtx& t, int64_t cost, F f) {
  const TensorNode* src = dst->src[0];
  const int64_t n = dst->numel();
  Range r = thread_range(t, n, cost);
  if (r.empty()) return;
  const Shape& s = dst->shape;
  auto L = make_layout<2>(s, {dst->stride, bcast_strides(src, s)});
  const bool stream = int64_t(dst->nbytes()) >= stream_threshold_bytes();
  const bool d16 = dst->dtype == DType::bf16, x16 = src->dtype == DType::bf16;
  for_each_run(L, {(char*)dst->data, (char*)src->data}, r.begin, r.end,
               [&](const Ptrs<2>& p, int64_t len, const Steps<2>& st) {
                 if (d16 || x16 || st[0] != 4 || st[1] != 4) {
                   float xb[kChunk], ob[kChunk];
                   for (int64_t i0 = 0; i0 < len; i0 += kChunk) {
                     const int64_t m = std::min(kChunk, len - i0);
                     const float* x = f32_chunk(p[1], st[1], x16, i0, m, xb);
                     float* o = out_chunk(p[0], st[0], d16, i0, ob);
                     map_dense(o, m, false,
                               [&](int64_t i, int k) { return f(load_lanes(x, i, k)); });
                     store_chunk(p[0], st[0], d16, i0, m, o);
                   }
                   return;
                 }
                 const float* x = (const float*)p[1];
                 map_dense((float*)p[0], len, stream,
                           [&](int64_t i, int m) { return f(load_lanes(x, i, m)); });
               });
}

constexpr int64_t kCheap = 1, kMid = 4, kHeavy = 8;

// dst = src0 * f(src1) elementwise (dy times a derivative at x), any strides;
// as run_unary, dst may be src0 itself.
template <class F>
void run_unary_back(TensorNode* dst, ThreadCtx& t, int64_t cost, F f) {
  const TensorNode* dy = dst->src[0];
  const TensorNode* x = dst->src[1];
  const int64_t n = dst->numel();
  Range r = thread_range(t, n, cost);
  if (r.empty()) return;
  const Shape& s = dst->shape;
  auto L = make_layout<3>(s, {dst->stride, bcast_strides(dy, s), bcast_strides(x, s)});
  const bool stream = int64_t(dst->nbytes()) >= stream_threshold_bytes();
  const bool d16 = dst->dtype == DType::bf16, x16 = x->dtype == DType::bf16;
  for_each_run(L, {(char*)dst->data, (char*)dy->data, (char*)x->data}, r.begin, r.end,
               [&](const Ptrs<3>& p, int64_t len, const Steps<3>& st) {
                 if (d16 || x16 || st[0] != 4 || st[1] != 4 || st[2] != 4) {
                   float gb[kChunk], xb[kChunk], ob[kChunk];
                   for (int64_t i0 = 0; i0 < len; i0 += kChunk) {
                     const int64_t m = std::min(kChunk, len - i0);
                     const float* g = f32_chunk(p[1], st[1], false, i0, m, gb);
                     const float* xs = f32_chunk(p[2], st[2], x16, i0, m, xb);
                     float* o = out_chunk(p[0], st[0], d16, i0, ob);
                     map_dense(o, m, false, [&](int64_t i, int k) {
                       return load_lanes(g, i, k) * f(load_lanes(xs, i, k));
                     });
                     store_chunk(p[0], st[0], d16, i0, m, o);
                   }
                   return;
                 }
                 const float* g = (const float*)p[1];
                 const float* xs = (const float*)p[2];
                 map_dense((float*)p[0], len, stream, [&](int64_t i, int m) {
                   return load_lanes(g, i, m) * f(load_lanes(xs, i, m));
                 });
               });
}

template <class V>
inline V zero() {
  return vm::c<V>(0.0f);
}

// x^p for a constant p. Common exponents get exact or cheaper forms; the rest
// use std::pow per element (pow is rare and never the bottleneck).
void run_pow(TensorNode* dst, ThreadCtx& t) {
  const float e = op_params<Op::POW>(*dst).exponent;
  if (e == 1.0f) return run_unary(dst, t, kCheap, [](auto x) { return x; });
  if (e == 2.0f) return run_unary(dst, t, kCheap, [](auto x) { return x * x; });
  if (e == 3.0f) return run_unary(dst, t, kCheap, [](auto x) { return x * x * x; });
  if (e == 0.5f) return run_unary(dst, t, kCheap, [](auto x) { return vm::sqrt(x); });
  if (e == -1.0f)
    return run_unary(dst, t, kCheap, [](auto x) {
      using V = decltype(x);
      return vm::c<V>(1.0f) / x;
    });
  if (e == 0.0f) return run_unary(dst, t, kCheap, [](auto x) { return vm::c<decltype(x)>(1.0f); });
  run_unary(dst, t, kHeavy * 4, [e](auto x) {
    using V = decltype(x);
    float buf[V::W];
    vm::store(buf, x);
    for (float& v : buf) v = std::pow(v, e);
    return vm::loadv<V>(buf);
  });
}

}  // namespace

void kernel_NEG(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) { return -x; });
}
void kernel_ABS(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) { return vm::abs(x); });
}
// -1, 0 or 1; NaN gives 0 (torch.sign: (0 < x) - (x < 0), both false for NaN).
void kernel_SIGN(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) {
    using V = decltype(x);
    V r = vm::select(x > zero<V>(), vm::c<V>(1.0f), zero<V>());
    return vm::select(x < zero<V>(), vm::c<V>(-1.0f), r);
  });
}
void kernel_SQR(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) { return x * x; });
}
void kernel_SQRT(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) { return vm::sqrt(x); });
}
// A correctly rounded sqrt, then a correctly rounded division (not the ~12-bit
// hardware estimate): within 1 ulp of 1/sqrt(x).
void kernel_RSQRT(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) { return vm::c<decltype(x)>(1.0f) / vm::sqrt(x); });
}
void kernel_EXP(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::exp(x); });
}
void kernel_LOG(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::log(x); });
}
void kernel_SIN(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::sin(x); });
}
void kernel_COS(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::cos(x); });
}
void kernel_POW(TensorNode* dst, ThreadCtx& t) { run_pow(dst, t); }
void kernel_SCALE(TensorNode* dst, ThreadCtx& t) {
  const ScaleParams p = op_params<Op::SCALE>(*dst);
  const float s = p.mul, b = p.add;
  run_unary(dst, t, kCheap, [s, b](auto x) {
    using V = decltype(x);
    return vm::madd(vm::c<V>(s), x, vm::c<V>(b));
  });
}
// min(max(x, lo), hi); NaN stays NaN (as torch.clamp).
void kernel_CLAMP(TensorNode* dst, ThreadCtx& t) {
  const ClampParams p = op_params<Op::CLAMP>(*dst);
  const float lo = p.lo, hi = p.hi;
  run_unary(dst, t, kCheap, [lo, hi](auto x) {
    using V = decltype(x);
    V r = vm::min(vm::max(x, vm::c<V>(lo)), vm::c<V>(hi));
    return vm::select(vm::isnan(x), x, r);
  });
}
// x > 0 ? x : 0 (NaN stays NaN).
void kernel_RELU(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kCheap, [](auto x) {
    using V = decltype(x);
    return vm::select(x < zero<V>(), zero<V>(), x);
  });
}
void kernel_LEAKY_RELU(TensorNode* dst, ThreadCtx& t) {
  const float slope = op_params<Op::LEAKY_RELU>(*dst).slope;
  run_unary(dst, t, kCheap, [slope](auto x) {
    using V = decltype(x);
    return vm::select(x > zero<V>(), x, x * vm::c<V>(slope));
  });
}
void kernel_GELU(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kHeavy, [](auto x) { return vm::gelu_tanh(x); });
}
void kernel_GELU_ERF(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kHeavy, [](auto x) { return vm::gelu_erf(x); });
}
void kernel_GELU_BACK(TensorNode* dst, ThreadCtx& t) {
  run_unary_back(dst, t, kHeavy, [](auto x) { return vm::gelu_tanh_grad(x); });
}
void kernel_GELU_ERF_BACK(TensorNode* dst, ThreadCtx& t) {
  run_unary_back(dst, t, kHeavy, [](auto x) { return vm::gelu_erf_grad(x); });
}
void kernel_ERF(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kHeavy, [](auto x) { return vm::erf(x); });
}
void kernel_SILU(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::silu(x); });
}
void kernel_SIGMOID(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::sigmoid(x); });
}
void kernel_TANH(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kMid, [](auto x) { return vm::tanh(x); });
}
void kernel_SOFTPLUS(TensorNode* dst, ThreadCtx& t) {
  run_unary(dst, t, kHeavy, [](auto x) { return vm::softplus(x); });
}

}  // namespace kiln::cpu
