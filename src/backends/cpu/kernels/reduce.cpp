// Reductions: SUM and MAX (over all elements or one axis, keepdim), ARGMAX, TOPK,
// COUNT_EQUAL.
//
// Determinism: a full reduction cuts the (row-major) element sequence into
// fixed blocks of kSumBlock, reduces each block the same way whichever thread
// gets it, and combines the block results in index order on thread 0 (partials
// go through shared scratch) — so the result is bit-identical for any thread
// count. An axis reduction gives each output element to one thread, which
// reduces it in a fixed order (blocks of kRowBlock rows, then across blocks).
// MAX propagates NaN (as torch.max).
// SUM also reads bf16 (f32 result): Graph::sum_bf16_gradients points a bias
// gradient's SUM at the bf16 copy of the gradient it sums. Each element is
// widened exactly and summed as an f32 one would be (full reductions convert
// runs in pieces of kWiden, each piece a block sum).
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {
namespace {

using vm::VF;
constexpr int W = vm::kW;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr int64_t kRowBlock = 256;  // axis sums: rows per partial sum

// NaN-propagating max of two floats.
inline float fmax_nan(float a, float b) {
  if (a != a) return a;
  if (b != b) return b;
  return b > a ? b : a;
}

float max_block(const float* p, int64_t n) {
  VF acc = vm::c<VF>(kNegInf);
  auto nan = vm::isnan(acc);
  int64_t i = 0;
  for (; i + W <= n; i += W) {
    VF x = vm::loadv<VF>(p + i);
    nan = nan | vm::isnan(x);
    acc = vm::max(acc, x);
  }
  if (i < n) {
    float buf[W];
    for (int k = 0; k < W; ++k) buf[k] = i + k < n ? p[i + k] : kNegInf;
    VF x = vm::loadv<VF>(buf);
    nan = nan | vm::isnan(x);
    acc = vm::max(acc, x);
  }
  return vm::any(nan) ? kNaN : vm::hmax(acc);
}

// Element i of a run of T (float or bf16 bits) at byte step `step`, as f32.
template <class T>
inline float at_f32(const char* p, int64_t i, int64_t step) {
  if constexpr (std::is_same_v<T, float>) return *(const float*)(p + i * step);
  else return bf16_to_f32(*(const uint16_t*)(p + i * step));
}

constexpr int64_t kWiden = 256;  // bf16 elements widened at a time

// Sum of a bf16 run with byte step `step`: pieces of kWiden, each widened and
// block-summed.
double sum_run_bf16(const char* p, int64_t len, int64_t step) {
  float buf[kWiden];
  double acc = 0.0;
  for (int64_t i0 = 0; i0 < len; i0 += kWiden) {
    const int64_t k = std::min(kWiden, len - i0);
    for (int64_t i = 0; i < k; ++i) buf[i] = at_f32<uint16_t>(p, i0 + i, step);
    acc += sum_block_f32(buf, k);
  }
  return acc;
}

// One block [b, e) of a full reduction over a (possibly strided) layout.
template <bool kMax>
double reduce_block(const Layout<1>& L, char* base, int64_t b, int64_t e, bool bf16) {
  double acc = kMax ? double(kNegInf) : 0.0;
  float m = kNegInf;
  for_each_run(L, {base}, b, e, [&](const Ptrs<1>& p, int64_t len, const Steps<1>& st) {
    const float* x = (const float*)p[0];
    if (!kMax && bf16) {
      acc += sum_run_bf16(p[0], len, st[0]);
    } else if (st[0] == 4) {
      if constexpr (kMax) m = fmax_nan(m, max_block(x, len));
      else acc += sum_block_f32(x, len);
    } else {
      const int64_t s = st[0] / 4;
      for (int64_t i = 0; i < len; ++i) {
        if constexpr (kMax) m = fmax_nan(m, x[i * s]);
        else acc += x[i * s];
      }
    }
  });
  return kMax ? double(m) : acc;
}

template <bool kMax>
void reduce_all(TensorNode* dst, const TensorNode* src, ThreadCtx& t) {
  const int64_t n = src->numel();
  const bool bf16 = src->dtype == DType::bf16;
  auto L = make_layout<1>(src->shape, {src->stride});
  char* base = (char*)src->data;
  const int64_t nblocks = (n + kSumBlock - 1) / kSumBlock;
  auto combine = [&](const double* part) {
    double acc = kMax ? double(kNegInf) : 0.0;
    for (int64_t i = 0; i < nblocks; ++i)
      acc = kMax ? double(fmax_nan(float(acc), float(part[i]))) : acc + part[i];
    *(float*)dst->data = float(acc);
  };
  if (useful_threads(n, t.nth) == 1) {  // small: thread 0 alone, same blocks
    if (t.ith != 0) return;
    double acc = kMax ? double(kNegInf) : 0.0;
    for (int64_t i = 0; i < nblocks; ++i) {
      double v = reduce_block<kMax>(L, base, i * kSumBlock, std::min(n, (i + 1) * kSumBlock), bf16);
      acc = kMax ? double(fmax_nan(float(acc), float(v))) : acc + v;
    }
    *(float*)dst->data = float(acc);
    return;
  }
  double* part = (double*)t.shared_scratch(size_t(nblocks) * sizeof(double));
  Range r = split_range(nblocks, t.ith, t.nth);
  for (int64_t i = r.begin; i < r.end; ++i)
    part[i] = reduce_block<kMax>(L, base, i * kSumBlock, std::min(n, (i + 1) * kSumBlock), bf16);
  t.barrier();
  if (t.ith == 0) combine(part);
}

// The output index space of an axis reduction: operand 0 = dst (dense),
// operand 1 = src without the reduced axis.
struct AxisPlan {
  Layout<2> L;
  int64_t n_out = 0, len = 0, step = 0;  // reduced length and its byte step
};
AxisPlan plan_axis(const TensorNode* dst, const TensorNode* src, int axis) {
  AxisPlan a;
  Shape o;
  Strides so{};
  for (int d = 0; d < src->shape.ndim(); ++d) {
    if (d == axis) continue;
    so[o.ndim()] = src->stride[d];
    o.push_back(src->shape[d]);
  }
  a.L = make_layout<2>(o, {dense_strides(o, int64_t(dst->elem_size())), so});
  a.n_out = o.numel();
  a.len = src->shape[axis];
  a.step = src->stride[axis];
  return a;
}

// Sum over `len` rows of `cols` dense columns (row byte step rs) of T into d:
// each column summed in blocks of kRowBlock rows, exactly as sum_strided below.
template <class T>
void sum_columns(float* d, const char* s, int64_t cols, int64_t len, int64_t rs) {
  constexpr int64_t kCols = 4 * W;
  float tot[kCols], part[kCols];
  for (int64_t c0 = 0; c0 < cols; c0 += kCols) {
    const int64_t nc = std::min(kCols, cols - c0);
    std::fill(tot, tot + kCols, 0.0f);
    for (int64_t r0 = 0; r0 < len; r0 += kRowBlock) {
      std::fill(part, part + kCols, 0.0f);
      const int64_t r1 = std::min(len, r0 + kRowBlock);
      for (int64_t r = r0; r < r1; ++r) {
        const char* row = s + r * rs + c0 * int64_t(sizeof(T));
        for (int64_t c = 0; c < nc; ++c) part[c] += at_f32<T>(row, c, sizeof(T));
      }
      for (int64_t c = 0; c < nc; ++c) tot[c] += part[c];
    }
    std::copy(tot, tot + nc, d + c0);
  }
}
template <class T>
float sum_strided(const char* s, int64_t len, int64_t rs) {
  float tot = 0.0f;
  for (int64_t r0 = 0; r0 < len; r0 += kRowBlock) {
    float part = 0.0f;
    const int64_t r1 = std::min(len, r0 + kRowBlock);
    for (int64_t r = r0; r < r1; ++r) part += at_f32<T>(s, r, rs);
    tot += part;
  }
  return tot;
}
float max_strided(const char* s, int64_t len, int64_t rs) {
  float m = kNegInf;
  for (int64_t r = 0; r < len; ++r) m = fmax_nan(m, *(const float*)(s + r * rs));
  return m;
}

// An axis reduction; SUM of bf16 takes the same paths (dense rows, dense
// columns, strided), each element widened as it is read.
template <bool kMax>
void reduce_axis(TensorNode* dst, const TensorNode* src, int axis, ThreadCtx& t) {
  const bool bf = !kMax && src->dtype == DType::bf16;
  const int64_t es = bf ? 2 : 4;
  AxisPlan a = plan_axis(dst, src, axis);
  Range r = thread_range(t, a.n_out, std::max<int64_t>(a.len, 1), 1);
  if (r.empty()) return;
  for_each_run(a.L, {(char*)dst->data, (char*)src->data}, r.begin, r.end,
               [&](const Ptrs<2>& p, int64_t n, const Steps<2>& st) {
                 float* d = (float*)p[0];
                 const int64_t sd = st[0] / 4;
                 if (a.step == es) {  // reduced axis is dense: row reductions
                   for (int64_t k = 0; k < n; ++k) {
                     const char* row = p[1] + k * st[1];
                     if (bf) d[k * sd] = float(sum_run_bf16(row, a.len, 2));
                     else if (kMax) d[k * sd] = max_block((const float*)row, a.len);
                     else d[k * sd] = float(sum_f32((const float*)row, a.len));
                   }
                 } else if (!kMax && st[0] == 4 && st[1] == es) {  // dense columns
                   if (bf) sum_columns<uint16_t>(d, p[1], n, a.len, a.step);
                   else sum_columns<float>(d, p[1], n, a.len, a.step);
                 } else {
                   for (int64_t k = 0; k < n; ++k) {
                     const char* s = p[1] + k * st[1];
                     d[k * sd] = kMax ? max_strided(s, a.len, a.step)
                                 : bf ? sum_strided<uint16_t>(s, a.len, a.step)
                                      : sum_strided<float>(s, a.len, a.step);
                   }
                 }
               });
}

template <bool kMax>
void reduce_kernel(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  KILN_ASSERT(src->dtype == DType::f32 || (!kMax && src->dtype == DType::bf16));
  const int64_t axis = op_params<ReduceParams>(*dst).axis;
  if (axis < 0 || src->shape.ndim() == 0) return reduce_all<kMax>(dst, src, t);
  reduce_axis<kMax>(dst, src, int(axis), t);
}

}  // namespace

void kernel_SUM(TensorNode* dst, ThreadCtx& t) { reduce_kernel<false>(dst, t); }
void kernel_MAX(TensorNode* dst, ThreadCtx& t) { reduce_kernel<true>(dst, t); }

namespace {
// Index of the first maximum along the axis of one row (a NaN counts as the
// maximum, as in torch.argmax).
template <class T>
int32_t argmax_row(const char* s, int64_t len, int64_t step) {
  int32_t best = 0;
  T bv = len > 0 ? *(const T*)s : T(0);
  for (int64_t i = 1; i < len && bv == bv; ++i) {
    T v = *(const T*)(s + i * step);
    if (v > bv || v != v) {
      bv = v;
      best = int32_t(i);
    }
  }
  return best;
}
}  // namespace

void kernel_ARGMAX(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  AxisPlan a = plan_axis(dst, src, int(op_params<Op::ARGMAX>(*dst).axis));
  Range r = thread_range(t, a.n_out, std::max<int64_t>(a.len, 1), 1);
  if (r.empty()) return;
  const bool is_int = src->dtype == DType::i32;
  for_each_run(a.L, {(char*)dst->data, (char*)src->data}, r.begin, r.end,
               [&](const Ptrs<2>& p, int64_t n, const Steps<2>& st) {
                 for (int64_t k = 0; k < n; ++k) {
                   const char* s = p[1] + k * st[1];
                   *(int32_t*)(p[0] + k * st[0]) = is_int ? argmax_row<int32_t>(s, a.len, a.step)
                                                          : argmax_row<float>(s, a.len, a.step);
                 }
               });
}

// TOPK: per row of the last axis, the indices of the k largest values, largest
// first (NaN above every number, equal values by index): a partial sort of the
// row's indices, each row by one thread.
void kernel_TOPK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* src = dst->src[0];
  const int nd = src->shape.ndim();
  const int64_t C = src->shape[nd - 1], k = op_params<Op::TOPK>(*dst).k;
  const int64_t rows = C > 0 ? src->numel() / C : 0;
  const Range r = thread_range(t, rows, C * 4, 1);
  if (r.empty()) return;
  auto* v = static_cast<float*>(t.scratch(size_t(C) * (sizeof(float) + sizeof(int32_t))));
  auto* idx = reinterpret_cast<int32_t*>(v + C);
  auto greater = [v](int32_t a, int32_t b) {
    const bool na = std::isnan(v[a]), nb = std::isnan(v[b]);
    if (na || nb) return na && (!nb || a < b);
    return v[a] > v[b] || (v[a] == v[b] && a < b);
  };
  int32_t* out = static_cast<int32_t*>(dst->data);
  for (int64_t row = r.begin; row < r.end; ++row) {
    int64_t off = 0, rest = row;
    for (int d = nd - 2; d >= 0; --d) {
      off += rest % src->shape[d] * src->stride[d];
      rest /= src->shape[d];
    }
    const char* s = static_cast<const char*>(src->data) + off;
    for (int64_t c = 0; c < C; ++c) {
      v[c] = *reinterpret_cast<const float*>(s + c * src->stride[nd - 1]);
      idx[c] = int32_t(c);
    }
    std::partial_sort(idx, idx + k, idx + C, greater);
    std::copy_n(idx, k, out + row * k);
  }
}

// Number of positions where src0 == src1 (same shape and dtype), as i32.
void kernel_COUNT_EQUAL(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *a = dst->src[0], *b = dst->src[1];
  const int64_t n = a->numel();
  const DType dt = a->dtype;
  auto L = make_layout<2>(a->shape, {a->stride, b->stride});
  auto count = [&](int64_t begin, int64_t end) {
    int64_t c = 0;
    for_each_run(L, {(char*)a->data, (char*)b->data}, begin, end,
                 [&](const Ptrs<2>& p, int64_t len, const Steps<2>& st) {
                   if (dt == DType::i32) {
                     for (int64_t i = 0; i < len; ++i)
                       c += *(const int32_t*)(p[0] + i * st[0]) ==
                            *(const int32_t*)(p[1] + i * st[1]);
                   } else if (dt == DType::f32) {
                     for (int64_t i = 0; i < len; ++i)
                       c += *(const float*)(p[0] + i * st[0]) == *(const float*)(p[1] + i * st[1]);
                   } else {
                     for (int64_t i = 0; i < len; ++i)
                       c += load_f32(p[0] + i * st[0], dt) == load_f32(p[1] + i * st[1], dt);
                   }
                 });
    return c;
  };
  if (useful_threads(n, t.nth) == 1) {
    if (t.ith == 0) *(int32_t*)dst->data = int32_t(count(0, n));
    return;
  }
  int64_t* part = (int64_t*)t.shared_scratch(size_t(t.nth) * sizeof(int64_t));
  Range r = split_range(n, t.ith, t.nth, 64);
  part[t.ith] = count(r.begin, r.end);
  t.barrier();
  if (t.ith == 0) {
    int64_t c = 0;
    for (int i = 0; i < t.nth; ++i) c += part[i];
    *(int32_t*)dst->data = int32_t(c);
  }
}

}  // namespace kiln::cpu
