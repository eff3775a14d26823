// Reference: matmul.
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

// MATMUL: [..., M, K] @ [..., K, N], batch dims broadcast (right-aligned).
RefValue ref_MATMUL(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RefValue& y = a.in(1);
  const int nx = x.shape.ndim(), ny = y.shape.ndim();
  if (nx < 2 || ny < 2) ref_fail(a.node, "matmul needs 2+ dims");
  const int64_t M = x.shape[nx - 2], K = x.shape[nx - 1], N = y.shape[ny - 1];
  if (y.shape[ny - 2] != K) ref_fail(a.node, x.shape.str() + " @ " + y.shape.str());
  Shape bx, by;
  for (int d = 0; d < nx - 2; ++d) bx.push_back(x.shape[d]);
  for (int d = 0; d < ny - 2; ++d) by.push_back(y.shape[d]);
  const Shape batch = ref_bcast_shape(a.node, bx, by);
  Shape s = batch;
  s.push_back(M);
  s.push_back(N);
  RefValue r = ref_out(a.node, s);
  if (a.node->dtype != DType::f32) ref_fail(a.node, "matmul result must be f32");
  // Iterate over output elements; for each, walk the K axis of both operands.
  Index it(s);
  const int nd = s.ndim();
  do {
    int64_t ix[kMaxDims] = {}, iy[kMaxDims] = {};
    for (int d = 0; d < nx - 2; ++d) ix[d] = bx[d] == 1 ? 0 : it.i[nd - 2 - (nx - 2) + d];
    for (int d = 0; d < ny - 2; ++d) iy[d] = by[d] == 1 ? 0 : it.i[nd - 2 - (ny - 2) + d];
    ix[nx - 2] = it.i[nd - 2];
    iy[ny - 1] = it.i[nd - 1];
    double acc = 0;
    for (int64_t k = 0; k < K; ++k) {
      ix[nx - 1] = k;
      iy[ny - 2] = k;
      acc += x.v[size_t(ref_linear(x.shape, ix))] * y.v[size_t(ref_linear(y.shape, iy))];
    }
    r.v[size_t(ref_linear(s, it.i))] = acc;
  } while (it.next());
  return r;
}

// MATMUL_ACC: src0 + src1 @ src2, all 2-D (ref_eval also stores the result as
// src0's value, the accumulator updated in place).
RefValue ref_MATMUL_ACC(const RefArgs& a) {
  const RefValue& acc = a.in(0);
  const RefValue& x = a.in(1);
  const RefValue& y = a.in(2);
  if (acc.shape.ndim() != 2 || x.shape.ndim() != 2 || y.shape.ndim() != 2)
    ref_fail(a.node, "matmul_acc needs 2-D tensors");
  const int64_t M = x.shape[0], K = x.shape[1], N = y.shape[1];
  if (y.shape[0] != K || acc.shape[0] != M || acc.shape[1] != N)
    ref_fail(a.node, acc.shape.str() + " += " + x.shape.str() + " @ " + y.shape.str());
  RefValue r = ref_out(a.node, acc.shape);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0;
      for (int64_t k = 0; k < K; ++k) s += x.v[size_t(i * K + k)] * y.v[size_t(k * N + j)];
      r.v[size_t(i * N + j)] = acc.v[size_t(i * N + j)] + s;
    }
  return r;
}

namespace {

// x's row for (n, j): x [N, K] or [N, k, K] (row-major values), at element offset.
int64_t expert_row_offset(const RefValue& x, int64_t n, int64_t j, int64_t k) {
  const int64_t K = x.shape[x.shape.ndim() - 1];
  return x.shape.ndim() == 2 ? n * K : (n * k + j) * K;
}

int64_t expert_id(const RefArgs& a, const RefValue& ids, int64_t slot, int64_t E) {
  const double e = ids.v[size_t(slot)];
  if (e < 0 || e >= double(E)) ref_fail(a.node, "expert id out of range");
  return int64_t(e);
}

}  // namespace

// EXPERT_MATMUL: dst[n, j, m] = sum_c w[ids[n, j], m, c] * x[n(, j), c].
RefValue ref_EXPERT_MATMUL(const RefArgs& a) {
  const RefValue &x = a.in(0), &w = a.in(1), &ids = a.in(2);
  const int64_t N = ids.shape[0], k = ids.shape[1], E = w.shape[0], M = w.shape[1], K = w.shape[2];
  RefValue r = ref_out(a.node, Shape{N, k, M});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = expert_id(a, ids, n * k + j, E), xo = expert_row_offset(x, n, j, k);
      for (int64_t m = 0; m < M; ++m) {
        double acc = 0;
        for (int64_t c = 0; c < K; ++c)
          acc += w.v[size_t((e * M + m) * K + c)] * x.v[size_t(xo + c)];
        r.v[size_t((n * k + j) * M + m)] = acc;
      }
    }
  return r;
}

// EXPERT_MATMUL_BACK_WEIGHT: dst[e, m, c] = sum over ids[n, j] = e of
// dy[n, j, m] * x[n(, j), c].
RefValue ref_EXPERT_MATMUL_BACK_WEIGHT(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1), &ids = a.in(2);
  const Shape& s = a.node->shape;
  const int64_t N = ids.shape[0], k = ids.shape[1], E = s[0], M = s[1], K = s[2];
  RefValue r = ref_out(a.node, s);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < k; ++j) {
      const int64_t e = expert_id(a, ids, n * k + j, E), xo = expert_row_offset(x, n, j, k);
      for (int64_t m = 0; m < M; ++m)
        for (int64_t c = 0; c < K; ++c)
          r.v[size_t((e * M + m) * K + c)] +=
              dy.v[size_t((n * k + j) * M + m)] * x.v[size_t(xo + c)];
    }
  return r;
}

}  // namespace kiln::test
