// Reductions: SUM MAX over all elements or one axis, ARGMAX, COUNT_EQUAL.
//
// Determinism: no float atomics anywhere. A full reduction cuts the row-major
// element sequence into fixed chunks of kChunk elements, one block each (the
// block's combining order is fixed by block_reduce), and a second one-block
// kernel adds the chunk results in a fixed order (in double for sums); COUNT_EQUAL
// counts the same way (exact integers). An axis reduction gives each output
// element to one thread or one block (axis_path in reduce_plan.h: shape and
// layout only), and sums in runs of 256 terms as the CPU does (blocked_sum), so
// long axes do not drift. So a result depends only on the data and the layout,
// never on timing. MAX propagates NaN (torch.max). SOFTMAX treats NaN as the
// CPU kernel does: a NaN in a row makes the row's unmasked results NaN (the
// whole row when every other entry is -inf).
#include <cfloat>
#include <cmath>

#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "backends/cuda/reduce_plan.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {
namespace {

constexpr int64_t kChunk = 4096;  // elements per block of a full reduction

// ---- full reductions
template <bool kMax>
__global__ void k_reduce_chunks(const char* s, Idx si, int64_t n, void* partial) {
  __shared__ float shm[33];
  const int64_t b0 = int64_t(blockIdx.x) * kChunk, b1 = min(n, b0 + kChunk);
  float acc = kMax ? -INFINITY : 0.0f;
  for (int64_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) {
    const float v = ldf(s, si.off(i));
    acc = kMax ? fmax_nan(acc, v) : acc + v;
  }
  const float r =
      kMax ? block_reduce(acc, -INFINITY, MaxNanOp{}, shm) : block_reduce(acc, 0.0f, SumOp{}, shm);
  if (threadIdx.x == 0) {
    if (kMax) static_cast<float*>(partial)[blockIdx.x] = r;
    else static_cast<double*>(partial)[blockIdx.x] = double(r);
  }
}

template <bool kMax>
__global__ void k_reduce_final(const void* partial, int64_t nb, float* d) {
  if (kMax) {
    __shared__ float shm[33];
    float acc = -INFINITY;
    for (int64_t i = threadIdx.x; i < nb; i += blockDim.x)
      acc = fmax_nan(acc, static_cast<const float*>(partial)[i]);
    const float r = block_reduce(acc, -INFINITY, MaxNanOp{}, shm);
    if (threadIdx.x == 0) *d = r;
  } else {
    __shared__ double shm[33];
    double acc = 0.0;
    for (int64_t i = threadIdx.x; i < nb; i += blockDim.x)
      acc += static_cast<const double*>(partial)[i];
    const double r = block_reduce(acc, 0.0, SumOp{}, shm);
    if (threadIdx.x == 0) *d = float(r);
  }
}

// ---- axis reductions: output o reads s + oi.off(o) + k*step for k < len.
template <bool kMax>
__global__ void k_axis_thread(const char* s, Idx oi, int64_t step, int64_t len, float* d,
                              int64_t n_out) {
  KILN_GRID_LOOP(o, n_out) {
    const char* p = s + oi.off(o);
    if (kMax) {
      float acc = -INFINITY;
      for (int64_t k = 0; k < len; ++k) acc = fmax_nan(acc, ldf(p, k * step));
      d[o] = acc;
    } else {
      d[o] = blocked_sum(len, [&](int64_t k) { return ldf(p, k * step); });
    }
  }
}

template <bool kMax>
__global__ void k_axis_block(const char* s, Idx oi, int64_t step, int64_t len, float* d) {
  __shared__ float shm[33];
  const char* p = s + oi.off(blockIdx.x);
  float acc = -INFINITY;
  const int64_t mine = len > threadIdx.x ? (len - threadIdx.x + blockDim.x - 1) / blockDim.x : 0;
  if (kMax) {
    for (int64_t k = threadIdx.x; k < len; k += blockDim.x) acc = fmax_nan(acc, ldf(p, k * step));
  } else {  // this thread's terms k = tid + j*blockDim, in runs (blocked_sum)
    acc =
        blocked_sum(mine, [&](int64_t j) { return ldf(p, (threadIdx.x + j * blockDim.x) * step); });
  }
  const float r =
      kMax ? block_reduce(acc, -INFINITY, MaxNanOp{}, shm) : block_reduce(acc, 0.0f, SumOp{}, shm);
  if (threadIdx.x == 0) d[blockIdx.x] = r;
}

// First maximum along the axis; a NaN counts as the maximum (torch.argmax).
__global__ void k_argmax(const char* s, Idx oi, int64_t step, int64_t len, bool ints, int32_t* d,
                         int64_t n_out) {
  KILN_GRID_LOOP(o, n_out) {
    const char* p = s + oi.off(o);
    int32_t best = 0;
    if (ints) {
      int32_t bv = len > 0 ? ldi(p, 0) : 0;
      for (int64_t k = 1; k < len; ++k) {
        const int32_t v = ldi(p, k * step);
        if (v > bv) {
          bv = v;
          best = int32_t(k);
        }
      }
    } else {
      float bv = len > 0 ? ldf(p, 0) : 0.0f;
      for (int64_t k = 1; k < len && bv == bv; ++k) {
        const float v = ldf(p, k * step);
        if (v > bv || v != v) {
          bv = v;
          best = int32_t(k);
        }
      }
    }
    d[o] = best;
  }
}

// COUNT_EQUAL over the whole grid: block b counts chunk b (kChunk elements)
// into partial[b]; k_count_final adds the partials (integers: exact).
__global__ void k_count_chunks(const char* a, Idx ai, const char* b, Idx bi, DType t, int64_t n,
                               long long* partial) {
  __shared__ long long shm[33];
  const int64_t b0 = int64_t(blockIdx.x) * kChunk, b1 = min(n, b0 + kChunk);
  long long c = 0;
  for (int64_t i = b0 + threadIdx.x; i < b1; i += blockDim.x) {
    const char* pa = a + ai.off(i);
    const char* pb = b + bi.off(i);
    if (t == DType::i32)
      c += *reinterpret_cast<const int32_t*>(pa) == *reinterpret_cast<const int32_t*>(pb);
    else c += load_as_f32(pa, t) == load_as_f32(pb, t);
  }
  const long long r = block_reduce(c, 0ll, SumOp{}, shm);
  if (threadIdx.x == 0) partial[blockIdx.x] = r;
}

__global__ void k_count_final(const long long* partial, int64_t nb, int32_t* d) {
  __shared__ long long shm[33];
  long long c = 0;
  for (int64_t i = threadIdx.x; i < nb; i += blockDim.x) c += partial[i];
  const long long r = block_reduce(c, 0ll, SumOp{}, shm);
  if (threadIdx.x == 0) *d = int32_t(r);
}

// The outer index space of an axis reduction over src: its dims without `axis`.
struct AxisPlan {
  Idx oi;
  int64_t n_out, len, step;
};
AxisPlan plan_axis(const TensorNode* src, int axis) {
  Shape o;
  int64_t so[kMaxDims] = {};
  for (int d = 0; d < src->shape.ndim(); ++d) {
    if (d == axis) continue;
    so[o.ndim()] = src->stride[size_t(d)];
    o.push_back(src->shape[d]);
  }
  AxisPlan a;
  a.oi = make_idx(o, so, int64_t(src->elem_size()));
  a.oi.dense = 0;  // offsets of whole rows: never the dense fast path
  a.n_out = o.numel();
  a.len = src->shape[axis];
  a.step = src->stride[size_t(axis)];
  return a;
}

bool full_reduction(const TensorNode* dst) {
  return prm::axis(dst) < 0 || dst->src[0]->shape.ndim() == 0;
}

template <bool kMax>
void reduce(TensorNode* dst, const Launch& L) {
  const TensorNode* src = dst->src[0];
  const char* s = static_cast<const char*>(src->data);
  float* d = static_cast<float*>(dst->data);
  if (full_reduction(dst)) {
    const int64_t n = src->numel();
    const int64_t nb = (n + kChunk - 1) / kChunk;
    if (nb == 0) {  // empty: the identity, written by a one-thread launch of the final kernel
      k_reduce_final<kMax><<<1, 32, 0, L.stream>>>(L.ws, 0, d);
      return check_launch(kMax ? "max" : "sum");
    }
    k_reduce_chunks<kMax><<<unsigned(nb), kThreads, 0, L.stream>>>(s, idx_of(src), n, L.ws);
    check_launch(kMax ? "max" : "sum");
    k_reduce_final<kMax><<<1, 1024, 0, L.stream>>>(L.ws, nb, d);
    return check_launch(kMax ? "max" : "sum");
  }
  const AxisPlan a = plan_axis(src, int(prm::axis(dst)));
  if (a.n_out == 0) return;
  if (axis_path(a.len, a.n_out, a.step, int64_t(src->elem_size())) == AxisPath::block)
    k_axis_block<kMax><<<unsigned(a.n_out), kThreads, 0, L.stream>>>(s, a.oi, a.step, a.len, d);
  else
    k_axis_thread<kMax>
        <<<grid_for(a.n_out), kThreads, 0, L.stream>>>(s, a.oi, a.step, a.len, d, a.n_out);
  check_launch(kMax ? "max" : "sum");
}

}  // namespace

size_t reduce_workspace(const TensorNode* dst) {
  const bool full = dst->op == Op::COUNT_EQUAL ||
                    ((dst->op == Op::SUM || dst->op == Op::MAX) && full_reduction(dst));
  if (!full) return 0;
  return size_t((dst->src[0]->numel() + kChunk - 1) / kChunk) * 8;  // a double or long long each
}

void reduce_ops(TensorNode* dst, const Launch& L) {
  switch (dst->op) {
    case Op::SUM: return reduce<false>(dst, L);
    case Op::MAX: return reduce<true>(dst, L);
    case Op::ARGMAX: {
      const TensorNode* src = dst->src[0];
      const AxisPlan a = plan_axis(src, int(prm::axis(dst)));
      if (a.n_out == 0) return;
      k_argmax<<<grid_for(a.n_out), kThreads, 0, L.stream>>>(
          static_cast<const char*>(src->data), a.oi, a.step, a.len, src->dtype == DType::i32,
          static_cast<int32_t*>(dst->data), a.n_out);
      return check_launch("argmax");
    }
    case Op::COUNT_EQUAL: {
      const TensorNode *a = dst->src[0], *b = dst->src[1];
      const int64_t n = a->numel(), nb = (n + kChunk - 1) / kChunk;
      long long* partial = reinterpret_cast<long long*>(L.ws);
      if (nb > 0) {
        k_count_chunks<<<unsigned(nb), kThreads, 0, L.stream>>>(
            static_cast<const char*>(a->data), idx_of(a), static_cast<const char*>(b->data),
            idx_of(b), a->dtype, n, partial);
        check_launch("count_equal");
      }
      k_count_final<<<1, 1024, 0, L.stream>>>(partial, nb, static_cast<int32_t*>(dst->data));
      return check_launch("count_equal");
    }
    default: fail("cuda", "reduce_ops got ", op_name(dst->op));
  }
}

OpKernel reduce_kernel(Op op) {
  switch (op) {
    case Op::SUM:
    case Op::MAX: return {all_f32, reduce_ops, reduce_workspace};
    case Op::ARGMAX:
      return {
          [](const TensorNode* n) { return n->dtype == DType::i32 && is_4byte(n->src[0]->dtype); },
          reduce_ops};
    case Op::COUNT_EQUAL:
      return {[](const TensorNode* n) {
                const TensorNode* s1 = n->n_src > 1 ? n->src[1] : nullptr;
                return n->dtype == DType::i32 && s1 && n->src[0]->dtype == s1->dtype;
              },
              reduce_ops, reduce_workspace};
    default: return {};
  }
}

}  // namespace kiln::cuda
