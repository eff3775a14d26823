// Reference: one-hot, row gather/scatter, concat, pad, repeat.
#include <cmath>
#include <limits>

#include "ops/reference/reference.h"

namespace kiln::test {

// ONE_HOT: labels [...] -> [..., classes] f32 (out-of-range labels not modelled).
RefValue ref_ONE_HOT(const RefArgs& a) {
  const RefValue& lab = a.in(0);
  const int64_t classes = a.params<OneHotParams>().classes;
  Shape s = lab.shape;
  s.push_back(classes);
  RefValue r = ref_out(a.node, s);
  for (int64_t k = 0; k < lab.numel(); ++k) {
    const int64_t c = int64_t(lab.v[size_t(k)]);
    if (c >= 0 && c < classes) r.v[size_t(k * classes + c)] = 1.0;
  }
  return r;
}

// EMBEDDING: table [V, D], indices [...] -> [..., D].
RefValue ref_EMBEDDING(const RefArgs& a) {
  const RefValue& t = a.in(0);
  const RefValue& idx = a.in(1);
  if (t.shape.ndim() != 2) ref_fail(a.node, "table must be [V, D], is " + t.shape.str());
  const int64_t V = t.shape[0], D = t.shape[1];
  Shape s = idx.shape;
  s.push_back(D);
  RefValue r = ref_out(a.node, s);
  for (int64_t k = 0; k < idx.numel(); ++k) {
    const int64_t row = int64_t(idx.v[size_t(k)]);
    if (row < 0 || row >= V) continue;  // range errors are not modelled
    for (int64_t d = 0; d < D; ++d) r.v[size_t(k * D + d)] = t.v[size_t(row * D + d)];
  }
  return r;
}

// SCATTER_ADD_ROWS: values [..., D], indices [...] -> zeros [i[0], D] += rows.
RefValue ref_SCATTER_ADD_ROWS(const RefArgs& a) {
  const RefValue& val = a.in(0);
  const RefValue& idx = a.in(1);
  const int nd = val.shape.ndim();
  if (nd < 1) ref_fail(a.node, "values need 1+ dims");
  const int64_t D = val.shape[nd - 1];
  if (idx.numel() * D != val.numel())
    ref_fail(a.node, "values " + val.shape.str() + " vs indices " + idx.shape.str());
  const int64_t rows = a.params<ScatterAddRowsParams>().rows;
  RefValue r = ref_out(a.node, Shape{rows, D});
  for (int64_t k = 0; k < idx.numel(); ++k) {
    const int64_t row = int64_t(idx.v[size_t(k)]);
    if (row < 0 || row >= rows) continue;
    for (int64_t d = 0; d < D; ++d) r.v[size_t(row * D + d)] += val.v[size_t(k * D + d)];
  }
  return r;
}

// CONCAT: the sources (2 to kMaxSrc) one after the other along i[0].
RefValue ref_CONCAT(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int nd = x.shape.ndim();
  int dim = int(a.params<ConcatParams>().dim);
  if (dim < 0) dim += nd;
  if (a.n_src < 2 || dim < 0 || dim >= nd) ref_fail(a.node, "bad concat");
  Shape s = x.shape;
  s[dim] = 0;
  for (int k = 0; k < a.n_src; ++k) {
    const RefValue& y = a.in(k);
    for (int d = 0; d < nd; ++d)
      if (y.shape.ndim() != nd || (d != dim && x.shape[d] != y.shape[d]))
        ref_fail(a.node, "concat " + x.shape.str() + " with " + y.shape.str());
    s[dim] += y.shape[dim];
  }
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    int64_t src_idx[kMaxDims];
    for (int d = 0; d < nd; ++d) src_idx[d] = it.i[d];
    int k = 0;
    while (src_idx[dim] >= a.in(k).shape[dim]) src_idx[dim] -= a.in(k++).shape[dim];
    const RefValue& from = a.in(k);
    r.v[size_t(ref_linear(s, it.i))] = from.v[size_t(ref_linear(from.shape, src_idx))];
  } while (it.next());
  return r;
}

// PAD: i[2d], i[2d+1] = before/after for dim d; f[0] = fill.
RefValue ref_PAD(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int nd = x.shape.ndim();
  Shape s = x.shape;
  for (int d = 0; d < nd; ++d)
    s[d] += a.params<PadParams>().before[size_t(d)] + a.params<PadParams>().after[size_t(d)];
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    int64_t src_idx[kMaxDims];
    bool inside = true;
    for (int d = 0; d < nd; ++d) {
      src_idx[d] = it.i[d] - a.params<PadParams>().before[size_t(d)];
      inside = inside && src_idx[d] >= 0 && src_idx[d] < x.shape[d];
    }
    r.v[size_t(ref_linear(s, it.i))] =
        inside ? x.v[size_t(ref_linear(x.shape, src_idx))] : double(a.params<PadParams>().value);
  } while (it.next());
  return r;
}

// REPEAT: dst[idx] = src[idx % src.shape] (same ndim; dst dims are multiples).
RefValue ref_REPEAT(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Shape& s = a.node->shape;
  if (s.ndim() != x.shape.ndim()) ref_fail(a.node, "repeat changes ndim");
  for (int d = 0; d < s.ndim(); ++d)
    if (x.shape[d] == 0 || s[d] % x.shape[d] != 0)
      ref_fail(a.node, s.str() + " is not a tiling of " + x.shape.str());
  RefValue r = ref_out(a.node);
  Index it(s);
  do {
    int64_t src_idx[kMaxDims];
    for (int d = 0; d < s.ndim(); ++d) src_idx[d] = it.i[d] % x.shape[d];
    r.v[size_t(ref_linear(s, it.i))] = x.v[size_t(ref_linear(x.shape, src_idx))];
  } while (it.next());
  return r;
}

// REPEAT_BACK: dst[j] = sum of src over the tiles of shape dst.shape.
RefValue ref_REPEAT_BACK(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Shape& s = a.node->shape;
  if (s.ndim() != x.shape.ndim()) ref_fail(a.node, "repeat_back changes ndim");
  for (int d = 0; d < s.ndim(); ++d)
    if (s[d] == 0 || x.shape[d] % s[d] != 0)
      ref_fail(a.node, x.shape.str() + " is not a tiling of " + s.str());
  RefValue r = ref_out(a.node);
  Index it(x.shape);
  do {
    int64_t dst_idx[kMaxDims];
    for (int d = 0; d < s.ndim(); ++d) dst_idx[d] = it.i[d] % s[d];
    r.v[size_t(ref_linear(s, dst_idx))] += x.v[size_t(ref_linear(x.shape, it.i))];
  } while (it.next());
  return r;
}

}  // namespace kiln::test
