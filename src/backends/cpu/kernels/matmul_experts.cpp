// EXPERT_MATMUL: dst [N, k, M] (f32), dst[n, j] = w[ids[n, j]] @ x[n] (x[n, j]
// when x is [N, k, K]); w [E, M, K] f32/f16/bf16 with any strides, or quantized.
// EXPERT_MATMUL_BACK_WEIGHT: dst [E, M, K] = per expert, the sum of dy[n, j]^T
// x[n(, j)] over the rows that chose it.
//
// Both group the (n, j) rows by expert first (every thread builds the same
// groups from ids, so no barrier is needed and every thread reports the same
// first bad id). Work is then dealt out as units (expert, block of kExpertRowBlock
// rows of M); a unit's values never depend on which thread runs it, so results
// are the same for any thread count, and each chosen expert's weights are read
// once per call (decoding reads only the chosen experts'). Per unit:
//   few rows (<= kGemvRows), w's rows contiguous: dot products of w's rows
//     with each x row in place (gemv.h), nothing gathered;
//   more rows: the group's x rows gathered, one gemm_alone on the block, the
//     result scattered back to the rows' places in dst.
// Quantized w runs the quantized matmul row kernels (qmatmul.h), which are
// collective: expert by expert, all threads together.
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemv.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/qmatmul.h"

namespace kiln::cpu {
namespace {

constexpr int64_t kExpertRowBlock = 64;  // rows of M per work unit
constexpr int64_t kExpertGemv = 8;       // rows of an expert at most that take the gemv path

// The (n, j) rows each expert was chosen by, as slots n * k + j in increasing
// order, expert by expert: slots[start[e] .. start[e + 1]).
struct ExpertGroups {
  std::vector<int64_t> start, slots;
  int64_t count(int64_t e) const { return start[size_t(e + 1)] - start[size_t(e)]; }
  const int64_t* of(int64_t e) const { return slots.data() + start[size_t(e)]; }
  int64_t largest = 0;
};

ExpertGroups group_rows_by_expert(const TensorNode* ids, int64_t E, const char* op) {
  const int64_t N = ids->shape[0], k = ids->shape[1];
  const char* base = static_cast<const char*>(ids->data);
  auto id = [&](int64_t n, int64_t j) {
    return int64_t(
        *reinterpret_cast<const int32_t*>(base + n * ids->stride[0] + j * ids->stride[1]));
  };
  ExpertGroups g;
  g.start.assign(size_t(E + 1), 0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = id(n, j);
      if (e < 0 || e >= E)
        fail(op, "expert id ", e, " at ids[", n, ", ", j, "] is out of range [0, ", E, ")");
      ++g.start[size_t(e + 1)];
    }
  for (int64_t e = 0; e < E; ++e) {
    g.largest = std::max(g.largest, g.start[size_t(e + 1)]);
    g.start[size_t(e + 1)] += g.start[size_t(e)];
  }
  g.slots.resize(size_t(N * k));
  std::vector<int64_t> fill(g.start.begin(), g.start.end() - 1);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) g.slots[size_t(fill[size_t(id(n, j))]++)] = n * k + j;
  return g;
}

// Row `slot` (= n * k + j) of an expert op's x or dy: [N, K] rows repeat over j.
const float* expert_src_row(const TensorNode* x, int64_t slot, int64_t k) {
  const char* p = static_cast<const char*>(x->data);
  if (x->shape.ndim() == 2) return reinterpret_cast<const float*>(p + slot / k * x->stride[0]);
  return reinterpret_cast<const float*>(p + slot / k * x->stride[0] + slot % k * x->stride[1]);
}

GemmType expert_gemm_type(DType t) {
  switch (t) {
    case DType::f32: return GemmType::f32;
    case DType::f16: return GemmType::f16;
    case DType::bf16: return GemmType::bf16;
    default: break;
  }
  fail("expert_matmul", "w must be f32, f16, bf16 or quantized, got ", dtype_name(t));
}

// Units (expert, row block) of the experts in `experts`, dealt to thread t in
// one contiguous range; fn(e, m0, m1) per unit.
template <class Fn>
void for_my_units(const std::vector<int64_t>& experts, int64_t rows, const ThreadCtx& t, Fn&& fn) {
  const int64_t blocks = (rows + kExpertRowBlock - 1) / kExpertRowBlock;
  const int64_t units = int64_t(experts.size()) * blocks;
  const int64_t u0 = units * t.ith / t.nth, u1 = units * (t.ith + 1) / t.nth;
  for (int64_t u = u0; u < u1; ++u) {
    const int64_t m0 = u % blocks * kExpertRowBlock;
    fn(experts[size_t(u / blocks)], m0, std::min(rows, m0 + kExpertRowBlock));
  }
}

void expert_matmul_float(TensorNode* dst, const ExpertGroups& g, ThreadCtx& t) {
  const TensorNode *x = dst->src[0], *w = dst->src[1];
  const int64_t k = dst->shape[1], M = dst->shape[2], K = w->shape[2], E = w->shape[0];
  const int64_t ew = int64_t(w->elem_size());
  const int64_t rs = w->stride[1] / ew, cs = w->stride[2] / ew;  // in elements
  const GemmType wt = expert_gemm_type(w->dtype);
  float* out = static_cast<float*>(dst->data);
  std::vector<int64_t> chosen;
  for (int64_t e = 0; e < E; ++e)
    if (g.count(e) > 0) chosen.push_back(e);
  // Gathered x rows and the block's product, for the gemm path.
  float* xs = nullptr;
  float* ys = nullptr;
  if (g.largest > kExpertGemv || cs != 1) {
    xs = static_cast<float*>(t.scratch(size_t(g.largest * (K + kExpertRowBlock)) * sizeof(float)));
    ys = xs + g.largest * K;
  }
  for_my_units(chosen, M, t, [&](int64_t e, int64_t m0, int64_t m1) {
    const char* we = static_cast<const char*>(w->data) + e * w->stride[0];
    const int64_t c = g.count(e);
    const int64_t* slot = g.of(e);
    if (c <= kExpertGemv && cs == 1) {
      const GemmOperand A{we, wt, rs, 1};
      const float* xr[kExpertGemv];
      float* yr[kExpertGemv];
      for (int64_t r = 0; r < c; ++r) {
        xr[r] = expert_src_row(x, slot[r], k);
        yr[r] = out + slot[r] * M;
      }
      if (c == 1) gemv_rows(A, xr[0], K, yr[0], m0, m1, false);
      else gemv_rows_multi(A, xr, c, K, yr, m0, m1, false);
      return;
    }
    for (int64_t r = 0; r < c; ++r) std::copy_n(expert_src_row(x, slot[r], k), K, xs + r * K);
    const int64_t mb = m1 - m0;
    // ys [c, mb] = xs [c, K] @ w[e, m0:m1]^T (B(kk, m) = w[e, m0 + m, kk]).
    GemmArgs a{};
    a.M = c, a.N = mb, a.K = K;
    a.A = {xs, GemmType::f32, K, 1};
    a.B = {we + m0 * rs * ew, wt, cs, rs};
    a.C = ys;
    a.ldc = mb;
    gemm_alone(a);
    for (int64_t r = 0; r < c; ++r) std::copy_n(ys + r * mb, mb, out + slot[r] * M + m0);
  });
}

// Quantized w: expert by expert with all threads (qmatmul is collective). Blocks
// along K: x @ W_e^T (qmatmul_xwt); along M (a transposed view of experts
// stored [E, K, M], the backward's): x @ W_e, W_e the stored [K, M] (qmatmul_xw).
void expert_matmul_quantized(TensorNode* dst, const ExpertGroups& g, ThreadCtx& t) {
  const TensorNode *x = dst->src[0], *w = dst->src[1];
  const int64_t k = dst->shape[1], M = dst->shape[2], K = w->shape[2], E = w->shape[0];
  const bool xwt = w->quant_axis() == 2;
  QuantMatrix W;
  W.format = w->dtype;
  W.rows = xwt ? M : K;
  W.cols = xwt ? K : M;
  W.row_stride = size_t(xwt ? w->stride[1] : w->stride[2]);
  float* out = static_cast<float*>(dst->data);
  // Groups of several rows are gathered into X [c, K] and computed into Y [c, M],
  // shared by all threads (the row kernels split the work between them).
  float* X = nullptr;
  if (g.largest > 1)
    X = static_cast<float*>(t.shared_scratch(size_t(g.largest * (K + M)) * sizeof(float)));
  for (int64_t e = 0; e < E; ++e) {
    const int64_t c = g.count(e);
    if (c == 0) continue;
    const int64_t* slot = g.of(e);
    W.data = static_cast<const char*>(w->data) + e * w->stride[0];
    auto run = [&](const float* xin, int64_t ldx, float* y, int64_t ldy, int64_t m) {
      if (xwt) qmatmul_xwt(W, xin, ldx, y, ldy, m, t);
      else qmatmul_xw(W, xin, ldx, y, ldy, m, t);
    };
    if (c == 1) {  // decoding: x's row and dst's row in place
      run(expert_src_row(x, slot[0], k), K, out + slot[0] * M, M, 1);
      continue;
    }
    float* Y = X + g.largest * K;
    const Range rows = split_range(c, t.ith, t.nth);
    for (int64_t r = rows.begin; r < rows.end; ++r)
      std::copy_n(expert_src_row(x, slot[r], k), K, X + r * K);
    t.barrier();
    run(X, K, Y, M, c);  // ends with a barrier
    for (int64_t r = rows.begin; r < rows.end; ++r) std::copy_n(Y + r * M, M, out + slot[r] * M);
    t.barrier();  // Y and X are the next expert's
  }
}

}  // namespace

void kernel_EXPERT_MATMUL(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* w = dst->src[1];
  const ExpertGroups g = group_rows_by_expert(dst->src[2], w->shape[0], "expert_matmul");
  if (dst->numel() == 0) return;
  if (is_quantized(w->dtype)) return expert_matmul_quantized(dst, g, t);
  expert_matmul_float(dst, g, t);
}

void kernel_EXPERT_MATMUL_BACK_WEIGHT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *dy = dst->src[0], *x = dst->src[1];
  const int64_t E = dst->shape[0], M = dst->shape[1], K = dst->shape[2], k = dy->shape[1];
  const ExpertGroups g = group_rows_by_expert(dst->src[2], E, "expert_matmul_back_weight");
  float* out = static_cast<float*>(dst->data);
  std::vector<int64_t> all(static_cast<size_t>(E));
  for (int64_t e = 0; e < E; ++e) all[size_t(e)] = e;
  // Gathered x rows [c, K] and the block's dy columns [c, kExpertRowBlock].
  float* xs =
      static_cast<float*>(t.scratch(size_t(g.largest * (K + kExpertRowBlock)) * sizeof(float)));
  float* ds = xs + g.largest * K;
  for_my_units(all, M, t, [&](int64_t e, int64_t m0, int64_t m1) {
    float* o = out + (e * M + m0) * K;
    const int64_t c = g.count(e), mb = m1 - m0;
    if (c == 0 || K == 0) {  // no row chose e: its gradient is 0
      std::fill(o, o + mb * K, 0.0f);
      return;
    }
    const int64_t* slot = g.of(e);
    for (int64_t r = 0; r < c; ++r) {
      std::copy_n(expert_src_row(x, slot[r], k), K, xs + r * K);
      std::copy_n(expert_src_row(dy, slot[r], k) + m0, mb, ds + r * mb);
    }
    // o [mb, K] = ds^T [mb, c] @ xs [c, K].
    GemmArgs a{};
    a.M = mb, a.N = K, a.K = c;
    a.A = {ds, GemmType::f32, 1, mb};
    a.B = {xs, GemmType::f32, K, 1};
    a.C = o;
    a.ldc = K;
    gemm_alone(a);
  });
}

}  // namespace kiln::cpu
