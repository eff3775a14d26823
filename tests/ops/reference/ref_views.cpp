// Reference: leaves and views.
#include <cstdint>

#include "kiln/ext/rng.h"
#include "ops/reference/reference.h"

namespace kiln::test {

// RESHAPE: same elements in row-major order (the builder only reshapes
// contiguous tensors, so the logical order is the memory order).
RefValue ref_RESHAPE(const RefArgs& a) {
  const RefValue& x = a.in(0);
  if (x.numel() != a.node->shape.numel())
    ref_fail(a.node, "reshape " + x.shape.str() + " to " + a.node->shape.str());
  RefValue r = ref_out(a.node);
  r.v = x.v;
  return r;
}

// PERMUTE: output axis d is source axis p.i[d].
RefValue ref_PERMUTE(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const int nd = x.shape.ndim();
  Shape s;
  bool used[kMaxDims] = {};
  for (int d = 0; d < nd; ++d) {
    const int64_t src_axis = a.params<PermuteParams>().axes[size_t(d)];
    if (src_axis < 0 || src_axis >= nd || used[src_axis]) ref_fail(a.node, "bad permutation");
    used[src_axis] = true;
    s.push_back(x.shape[int(src_axis)]);
  }
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    int64_t src_idx[kMaxDims] = {};
    for (int d = 0; d < nd; ++d) src_idx[a.params<PermuteParams>().axes[size_t(d)]] = it.i[d];
    r.v[size_t(ref_linear(s, it.i))] = x.v[size_t(ref_linear(x.shape, src_idx))];
  } while (it.next());
  return r;
}

// NARROW: i[0]=dim, i[1]=start, i[2]=length.
RefValue ref_NARROW(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const NarrowParams prm = a.params<NarrowParams>();
  const int dim = int(prm.dim);
  const int64_t start = prm.start, len = prm.length;
  if (dim < 0 || dim >= x.shape.ndim() || start < 0 || len < 0 || start + len > x.shape[dim])
    ref_fail(a.node, "narrow out of range");
  Shape s = x.shape;
  s[dim] = len;
  RefValue r = ref_out(a.node, s);
  Index it(s);
  if (s.numel() == 0) return r;
  do {
    int64_t src_idx[kMaxDims];
    for (int d = 0; d < s.ndim(); ++d) src_idx[d] = it.i[d];
    src_idx[dim] += start;
    r.v[size_t(ref_linear(s, it.i))] = x.v[size_t(ref_linear(x.shape, src_idx))];
  } while (it.next());
  return r;
}

// EXPAND: size-1 (or missing leading) dims are repeated to the node's shape.
RefValue ref_EXPAND(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const Shape& s = a.node->shape;
  if (s.ndim() < x.shape.ndim()) ref_fail(a.node, "expand to fewer dims");
  for (int d = 0; d < x.shape.ndim(); ++d) {
    const int64_t want = s[s.ndim() - x.shape.ndim() + d];
    if (x.shape[d] != 1 && x.shape[d] != want)
      ref_fail(a.node, "cannot expand " + x.shape.str() + " to " + s.str());
  }
  RefValue r = ref_out(a.node);
  Index it(s);
  do {
    r.v[size_t(ref_linear(s, it.i))] = ref_bcast_at(x, it.i, s.ndim());
  } while (it.next());
  return r;
}

// A leaf has no computation: its value must be given by the caller.
RefValue ref_NONE(const RefArgs& a) { ref_fail(a.node, "leaf without a given value"); }

}  // namespace kiln::test
