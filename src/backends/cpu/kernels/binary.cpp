// Elementwise binary kernels with numpy broadcasting: ADD SUB MUL DIV COMPARE WHERE,
// and the in-place ACCUMULATE (gradient accumulators: src0 += src1).
//
// All operands are walked as runs along the innermost (merged) dim
// (common.h: make_layout / for_each_run). Each run takes the fastest loop its
// steps allow: all dense, one side broadcast (stride 0: scalars, bias rows,
// column vectors), or a plain strided loop. Elements are independent, so any
// thread split gives the same bits, and dst may alias a source (in place).
#include <cmath>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {
namespace {

using vm::SF;
using vm::VF;

// d[i] = f(a[i], b[i]) for dense rows; A/B = true when that side is a broadcast
// scalar (stride 0).
template <bool A, bool B, class F>
void map2_dense(float* d, const float* a, const float* b, int64_t n, bool stream, F f) {
  const VF av = vm::c<VF>(*a), bv = vm::c<VF>(*b);
  map_dense(d, n, stream, [&](int64_t i, int m) {
    return f(A ? av : load_lanes(a, i, m), B ? bv : load_lanes(b, i, m));
  });
}

// dst = f(a, b) over dst's shape; f is a generic lambda usable with VF and SF.
template <class F>
void run_binary(TensorNode* dst, const TensorNode* a, const TensorNode* b, ThreadCtx& t, F f) {
  const int64_t n = dst->numel();
  Range r = thread_range(t, n);
  if (r.empty()) return;
  const Shape& s = dst->shape;
  auto L = make_layout<3>(s, {dst->stride, bcast_strides(a, s), bcast_strides(b, s)});
  const bool stream = int64_t(dst->nbytes()) >= stream_threshold_bytes();
  for_each_run(L, {(char*)dst->data, (char*)a->data, (char*)b->data}, r.begin, r.end,
               [&](const Ptrs<3>& p, int64_t len, const Steps<3>& st) {
                 float* d = (float*)p[0];
                 const float* x = (const float*)p[1];
                 const float* y = (const float*)p[2];
                 if (st[0] == 4) {
                   if (st[1] == 4 && st[2] == 4)
                     return map2_dense<false, false>(d, x, y, len, stream, f);
                   if (st[1] == 4 && st[2] == 0)
                     return map2_dense<false, true>(d, x, y, len, stream, f);
                   if (st[1] == 0 && st[2] == 4)
                     return map2_dense<true, false>(d, x, y, len, stream, f);
                 }
                 const int64_t sd = st[0] / 4, sx = st[1] / 4, sy = st[2] / 4;
                 for (int64_t i = 0; i < len; ++i) d[i * sd] = f(SF{x[i * sx]}, SF{y[i * sy]}).v;
               });
}

template <class V>
inline V to01(typename V::M m) {
  return vm::select(m, vm::c<V>(1.0f), vm::c<V>(0.0f));
}

// COMPARE on i32 operands: a scalar loop (labels and counts, never large).
template <class Cmp>
void run_cmp_i32(TensorNode* dst, const TensorNode* a, const TensorNode* b, ThreadCtx& t, Cmp cmp) {
  const int64_t n = dst->numel();
  Range r = thread_range(t, n);
  if (r.empty()) return;
  const Shape& s = dst->shape;
  auto L = make_layout<3>(s, {dst->stride, bcast_strides(a, s), bcast_strides(b, s)});
  for_each_run(L, {(char*)dst->data, (char*)a->data, (char*)b->data}, r.begin, r.end,
               [&](const Ptrs<3>& p, int64_t len, const Steps<3>& st) {
                 for (int64_t i = 0; i < len; ++i) {
                   int32_t x, y;
                   std::memcpy(&x, p[1] + i * st[1], 4);
                   std::memcpy(&y, p[2] + i * st[2], 4);
                   float v = cmp(x, y) ? 1.0f : 0.0f;
                   std::memcpy(p[0] + i * st[0], &v, 4);
                 }
               });
}

template <int Mode>
void cmp_dispatch(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *a = dst->src[0], *b = dst->src[1];
  if (a->dtype == DType::i32) {
    run_cmp_i32(dst, a, b, t, [](int32_t x, int32_t y) {
      if constexpr (Mode == 0) return x == y;
      else if constexpr (Mode == 1) return x != y;
      else if constexpr (Mode == 2) return x < y;
      else if constexpr (Mode == 3) return x <= y;
      else if constexpr (Mode == 4) return x > y;
      else return x >= y;
    });
    return;
  }
  run_binary(dst, a, b, t, [](auto x, auto y) {
    using V = decltype(x);
    if constexpr (Mode == 0) return to01<V>(x == y);
    else if constexpr (Mode == 1) return to01<V>(x != y);
    else if constexpr (Mode == 2) return to01<V>(x < y);
    else if constexpr (Mode == 3) return to01<V>(x <= y);
    else if constexpr (Mode == 4) return to01<V>(x > y);
    else return to01<V>(x >= y);
  });
}

}  // namespace

void binary_f32(BinaryOp op, TensorNode* dst, const TensorNode* a, const TensorNode* b,
                ThreadCtx& t) {
  switch (op) {
    case BinaryOp::add: return run_binary(dst, a, b, t, [](auto x, auto y) { return x + y; });
    case BinaryOp::sub: return run_binary(dst, a, b, t, [](auto x, auto y) { return x - y; });
    case BinaryOp::mul: return run_binary(dst, a, b, t, [](auto x, auto y) { return x * y; });
    case BinaryOp::div: return run_binary(dst, a, b, t, [](auto x, auto y) { return x / y; });
  }
}

void kernel_ADD(TensorNode* dst, ThreadCtx& t) {
  binary_f32(BinaryOp::add, dst, dst->src[0], dst->src[1], t);
}
void kernel_SUB(TensorNode* dst, ThreadCtx& t) {
  binary_f32(BinaryOp::sub, dst, dst->src[0], dst->src[1], t);
}
void kernel_MUL(TensorNode* dst, ThreadCtx& t) {
  binary_f32(BinaryOp::mul, dst, dst->src[0], dst->src[1], t);
}
void kernel_DIV(TensorNode* dst, ThreadCtx& t) {
  binary_f32(BinaryOp::div, dst, dst->src[0], dst->src[1], t);
}

void kernel_COMPARE(TensorNode* dst, ThreadCtx& t) {
  const CompareMode mode = op_params<Op::COMPARE>(*dst).mode;
  switch (mode) {
    case CompareMode::eq: return cmp_dispatch<0>(dst, t);
    case CompareMode::ne: return cmp_dispatch<1>(dst, t);
    case CompareMode::lt: return cmp_dispatch<2>(dst, t);
    case CompareMode::le: return cmp_dispatch<3>(dst, t);
    case CompareMode::gt: return cmp_dispatch<4>(dst, t);
    case CompareMode::ge: return cmp_dispatch<5>(dst, t);
    default: fail("compare", "unknown comparison mode ", int64_t(mode));
  }
}

// dst = cond != 0 ? x : y. cond is f32 (NaN counts as true, -0 as false) or i32.
void kernel_WHERE(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *c = dst->src[0], *x = dst->src[1], *y = dst->src[2];
  const int64_t n = dst->numel();
  Range r = thread_range(t, n);
  if (r.empty()) return;
  const Shape& s = dst->shape;
  const bool ci = c->dtype == DType::i32;
  auto L = make_layout<4>(
      s, {dst->stride, bcast_strides(c, s), bcast_strides(x, s), bcast_strides(y, s)});
  for_each_run(L, {(char*)dst->data, (char*)c->data, (char*)x->data, (char*)y->data}, r.begin,
               r.end, [&](const Ptrs<4>& p, int64_t len, const Steps<4>& st) {
                 float* d = (float*)p[0];
                 if (!ci && st[0] == 4 && st[1] == 4 && st[2] == 4 && st[3] == 4) {
                   const float *cp = (const float*)p[1], *xp = (const float*)p[2],
                               *yp = (const float*)p[3];
                   return map_dense(d, len, false, [&](int64_t i, int m) {
                     return vm::select(load_lanes(cp, i, m) != vm::c<VF>(0.0f),
                                       load_lanes(xp, i, m), load_lanes(yp, i, m));
                   });
                 }
                 for (int64_t i = 0; i < len; ++i) {
                   bool cond;
                   if (ci) {
                     int32_t v;
                     std::memcpy(&v, p[1] + i * st[1], 4);
                     cond = v != 0;
                   } else {
                     float v;
                     std::memcpy(&v, p[1] + i * st[1], 4);
                     cond = v != 0.0f;
                   }
                   const char* src = cond ? p[2] + i * st[2] : p[3] + i * st[3];
                   std::memcpy((char*)d + i * st[0], src, 4);
                 }
               });
}

// src0 += src1 in place (dst aliases src0); src1 broadcasts to src0's shape.
void kernel_ACCUMULATE(TensorNode* dst, ThreadCtx& t) {
  binary_f32(BinaryOp::add, dst, dst->src[0], dst->src[1], t);
}

}  // namespace kiln::cpu
