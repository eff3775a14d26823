// Broadcasting binary ops: ADD SUB MUL DIV, COMPARE, WHERE and the in-place
// ACCUMULATE.
//
// Elementwise kernels share one shape (common.cuh): one thread per output
// element (grid-stride), operands addressed through Idx (any byte strides, numpy
// broadcasting), so each element is computed by the same expression whatever the
// launch shape: results never depend on it. dst may alias a source (in place):
// an element is read before it is written, by the same thread.
#include "backends/cuda/common.cuh"
#include "backends/cuda/params.h"
#include "kiln/error.h"

namespace kiln::cuda {
namespace {

// ------------------------------------------------------------------ binary
enum BinOp { kAdd, kSub, kMul, kDiv };

template <int Op>
__global__ void k_binary(char* d, Idx di, const char* a, Idx ai, const char* b, Idx bi, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const float x = ldf(a, ai.off(i)), y = ldf(b, bi.off(i));
    float r;
    if constexpr (Op == kAdd) r = x + y;
    else if constexpr (Op == kSub) r = x - y;
    else if constexpr (Op == kMul) r = x * y;
    else r = x / y;
    atf(d, di.off(i)) = r;
  }
}

template <class T>
__device__ inline bool compare(int mode, T x, T y) {
  switch (mode) {
    case 0: return x == y;
    case 1: return x != y;
    case 2: return x < y;
    case 3: return x <= y;
    case 4: return x > y;
    default: return x >= y;
  }
}

__global__ void k_cmp(char* d, Idx di, const char* a, Idx ai, const char* b, Idx bi, int mode,
                      bool ints, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    bool r;
    if (ints) r = compare(mode, ldi(a, ai.off(i)), ldi(b, bi.off(i)));
    else r = compare(mode, ldf(a, ai.off(i)), ldf(b, bi.off(i)));
    atf(d, di.off(i)) = r ? 1.0f : 0.0f;
  }
}

// cond != 0 ? x : y; an f32 cond that is NaN counts as true, -0 as false.
__global__ void k_where(char* d, Idx di, const char* c, Idx ci, bool cint, const char* x, Idx xi,
                        const char* y, Idx yi, int64_t n) {
  KILN_GRID_LOOP(i, n) {
    const bool cond = cint ? ldi(c, ci.off(i)) != 0 : ldf(c, ci.off(i)) != 0.0f;
    const char* s = cond ? x + xi.off(i) : y + yi.off(i);
    *reinterpret_cast<uint32_t*>(d + di.off(i)) = *reinterpret_cast<const uint32_t*>(s);
  }
}

}  // namespace

void binary_ops(TensorNode* dst, const Launch& L) {
  const int64_t n = dst->numel();
  char* d = static_cast<char*>(dst->data);
  const Shape& s = dst->shape;
  const TensorNode *a = dst->src[0], *b = dst->src[1];
  const char* ap = static_cast<const char*>(a->data);
  const char* bp = b ? static_cast<const char*>(b->data) : nullptr;
  const unsigned grid = grid_for(n);
  switch (dst->op) {
    case Op::ADD:
    case Op::ACCUMULATE:
      k_binary<kAdd><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::SUB:
      k_binary<kSub><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::MUL:
      k_binary<kMul><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::DIV:
      k_binary<kDiv><<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                                      bcast_idx(b, s), n);
      break;
    case Op::COMPARE:
      k_cmp<<<grid, kThreads, 0, L.stream>>>(d, idx_of(dst), ap, bcast_idx(a, s), bp,
                                             bcast_idx(b, s), prm::cmp_mode(dst),
                                             a->dtype == DType::i32, n);
      break;
    case Op::WHERE: {
      const TensorNode* y = dst->src[2];
      k_where<<<grid, kThreads, 0, L.stream>>>(
          d, idx_of(dst), ap, bcast_idx(a, s), a->dtype == DType::i32, bp, bcast_idx(b, s),
          static_cast<const char*>(y->data), bcast_idx(y, s), n);
      break;
    }
    default: fail("cuda", "binary_ops got ", op_name(dst->op));
  }
  check_launch(op_name(dst->op));
}

OpKernel binary_kernel(Op op) {
  switch (op) {
    case Op::ADD:
    case Op::SUB:
    case Op::MUL:
    case Op::DIV:
    case Op::ACCUMULATE: return {all_f32, binary_ops};
    case Op::COMPARE:
      return {[](const TensorNode* n) {
                const TensorNode* s0 = n->n_src > 0 ? n->src[0] : nullptr;
                const TensorNode* s1 = n->n_src > 1 ? n->src[1] : nullptr;
                return n->dtype == DType::f32 && s0 && s1 && s0->dtype == s1->dtype &&
                       is_4byte(s0->dtype);
              },
              binary_ops};
    case Op::WHERE:
      return {[](const TensorNode* n) {
                return n->n_src == 3 && is_4byte(n->src[0]->dtype) && is_4byte(n->dtype) &&
                       n->src[1]->dtype == n->dtype && n->src[2]->dtype == n->dtype;
              },
              binary_ops};
    default: return {};
  }
}

}  // namespace kiln::cuda
