// Reference: elementwise binary ops (numpy broadcasting), compare, where, and
// the in-place ACCUMULATE.
#include <functional>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

// out[idx] = f(a[bcast idx], b[bcast idx]) over the broadcast shape.
RefValue binary(const RefArgs& a, const std::function<double(double, double)>& f) {
  const RefValue& x = a.in(0);
  const RefValue& y = a.in(1);
  const Shape s = ref_bcast_shape(a.node, x.shape, y.shape);
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    const double v = f(ref_bcast_at(x, it.i, s.ndim()), ref_bcast_at(y, it.i, s.ndim()));
    r.v[size_t(ref_linear(s, it.i))] = ref_round_to(a.node->dtype, v);
  } while (it.next());
  return r;
}

}  // namespace

RefValue ref_ADD(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x + y; });
}

RefValue ref_SUB(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x - y; });
}

RefValue ref_MUL(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x * y; });
}

RefValue ref_DIV(const RefArgs& a) {
  return binary(a, [](double x, double y) { return x / y; });
}

// COMPARE: i[0] 0 eq, 1 ne, 2 lt, 3 le, 4 gt, 5 ge; result 1/0.
RefValue ref_COMPARE(const RefArgs& a) {
  const int64_t code = int64_t(a.params<CompareParams>().mode);
  if (code < 0 || code > 5) ref_fail(a.node, "bad comparison code " + std::to_string(code));
  return binary(a, [code](double x, double y) {
    bool r = false;
    switch (code) {
      case 0: r = x == y; break;
      case 1: r = x != y; break;
      case 2: r = x < y; break;
      case 3: r = x <= y; break;
      case 4: r = x > y; break;
      case 5: r = x >= y; break;
    }
    return r ? 1.0 : 0.0;
  });
}

// WHERE: cond != 0 ? a : b, all three broadcast.
RefValue ref_WHERE(const RefArgs& a) {
  const RefValue& c = a.in(0);
  const RefValue& x = a.in(1);
  const RefValue& y = a.in(2);
  const Shape s = ref_bcast_shape(a.node, ref_bcast_shape(a.node, c.shape, x.shape), y.shape);
  RefValue r = ref_out(a.node, s);
  Index it(s);
  do {
    const int nd = s.ndim();
    const double v =
        ref_bcast_at(c, it.i, nd) != 0.0 ? ref_bcast_at(x, it.i, nd) : ref_bcast_at(y, it.i, nd);
    r.v[size_t(ref_linear(s, it.i))] = v;
  } while (it.next());
  return r;
}

// ACCUMULATE: src0 + src1 (ref_eval also stores the result as src0's value).
RefValue ref_ACCUMULATE(const RefArgs& a) {
  const RefValue& acc = a.in(0);
  const RefValue& g = a.in(1);
  if (!(acc.shape == g.shape))
    ref_fail(a.node, "accumulate " + g.shape.str() + " into " + acc.shape.str());
  RefValue r = ref_out(a.node, acc.shape);
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = acc.v[k] + g.v[k];
  return r;
}

}  // namespace kiln::test
