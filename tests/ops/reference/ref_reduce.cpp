// Reference: reductions.
#include <cmath>
#include <limits>

#include "kiln/ext/tensor_node.h"
#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

// The reduced shape: axis -1 reduces everything (to 0 dims, or all-ones with keepdim).
Shape reduced_shape(const TensorNode* node, const Shape& s, int64_t axis, bool keepdim) {
  Shape r;
  if (axis < -1 || axis >= s.ndim())
    ref_fail(node, "axis " + std::to_string(axis) + " out of range");
  for (int d = 0; d < s.ndim(); ++d) {
    if (axis == -1 || d == axis) {
      if (keepdim) r.push_back(1);
    } else {
      r.push_back(s[d]);
    }
  }
  return r;
}

// Linear index in the reduced output of the source element at idx.
int64_t reduced_linear(const Shape& s, const int64_t* idx, int64_t axis) {
  int64_t l = 0;
  for (int d = 0; d < s.ndim(); ++d) {
    if (axis == -1 || d == axis) continue;
    l = l * s[d] + idx[d];
  }
  return l;
}

}  // namespace

// SUM: i[0] = axis or -1 (all), i[1] = keepdim.
RefValue ref_SUM(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int64_t axis = a.params<ReduceParams>().axis;
  RefValue r =
      ref_out(a.node, reduced_shape(a.node, x.shape, axis, a.params<ReduceParams>().keepdim));
  Index it(x.shape);
  if (x.numel() == 0) return r;
  do {
    r.v[size_t(reduced_linear(x.shape, it.i, axis))] += x.v[size_t(ref_linear(x.shape, it.i))];
  } while (it.next());
  return r;
}

// MAX: as SUM.
RefValue ref_MAX(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int64_t axis = a.params<ReduceParams>().axis;
  RefValue r =
      ref_out(a.node, reduced_shape(a.node, x.shape, axis, a.params<ReduceParams>().keepdim));
  for (double& e : r.v) e = -std::numeric_limits<double>::infinity();
  Index it(x.shape);
  do {
    double& m = r.v[size_t(reduced_linear(x.shape, it.i, axis))];
    m = std::max(m, x.v[size_t(ref_linear(x.shape, it.i))]);
  } while (it.next());
  return r;
}

// ARGMAX: index along axis i[0] (>= 0) of the first maximum; i32.
RefValue ref_ARGMAX(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int64_t axis = a.params<ReduceParams>().axis;
  if (axis < 0) ref_fail(a.node, "argmax needs an axis >= 0");
  RefValue r =
      ref_out(a.node, reduced_shape(a.node, x.shape, axis, a.params<ReduceParams>().keepdim));
  if (a.node->dtype != DType::i32) ref_fail(a.node, "argmax result must be i32");
  std::vector<double> best(r.v.size(), -std::numeric_limits<double>::infinity());
  std::vector<bool> seen(r.v.size(), false);
  Index it(x.shape);  // row-major: along the axis, earlier indices come first
  do {
    const size_t o = size_t(reduced_linear(x.shape, it.i, axis));
    const double v = x.v[size_t(ref_linear(x.shape, it.i))];
    if (!seen[o] || v > best[o]) {
      seen[o] = true;
      best[o] = v;
      r.v[o] = double(it.i[axis]);
    }
  } while (it.next());
  return r;
}

// TOPK: indices of the k largest along the last axis, largest first; equal
// values by index, NaN above every number; i32.
RefValue ref_TOPK(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int nd = x.shape.ndim();
  const int64_t C = x.shape[nd - 1], k = a.params<TopkParams>().k;
  Shape s = x.shape;
  s[nd - 1] = k;
  RefValue r = ref_out(a.node, s);
  if (a.node->dtype != DType::i32) ref_fail(a.node, "topk result must be i32");
  for (int64_t row = 0; row < (C ? x.numel() / C : 0); ++row) {
    std::vector<bool> taken(size_t(C), false);
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = -1;
      for (int64_t c = 0; c < C; ++c) {
        if (taken[size_t(c)]) continue;
        const double v = x.v[size_t(row * C + c)];
        if (best < 0) {
          best = c;
          continue;
        }
        const double b = x.v[size_t(row * C + best)];
        if (!std::isnan(b) && (std::isnan(v) || v > b)) best = c;
      }
      taken[size_t(best)] = true;
      r.v[size_t(row * k + j)] = double(best);
    }
  }
  return r;
}

// COUNT_EQUAL: number of equal elements of two same-shape tensors; i32 scalar.
RefValue ref_COUNT_EQUAL(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RefValue& y = a.in(1);
  if (!(x.shape == y.shape)) ref_fail(a.node, "shapes " + x.shape.str() + " and " + y.shape.str());
  if (x.dtype != y.dtype) ref_fail(a.node, "dtypes differ");
  RefValue r = ref_out(a.node, Shape());
  double n = 0;
  for (size_t k = 0; k < x.v.size(); ++k) n += x.v[k] == y.v[k] ? 1 : 0;
  r.v[0] = n;
  return r;
}

}  // namespace kiln::test
