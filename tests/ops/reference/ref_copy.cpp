// Reference: copies and constants.
#include <cstdint>

#include "kiln/ext/rng.h"
#include "ops/reference/reference.h"

namespace kiln::test {

// COPY: convert to the node's dtype (f16/bf16 rounding, f32 -> i32 truncation).
RefValue ref_COPY(const RefArgs& a) {
  const RefValue& x = a.in(0);
  RefValue r = ref_out(a.node, x.shape);
  if (is_quantized(a.node->dtype)) {  // quantize: whole rows
    r.v = x.v;
    ref_round_rows_to(a.node->dtype, r.v, x.shape[x.shape.ndim() - 1]);
    return r;
  }
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = ref_round_to(a.node->dtype, x.v[k]);
  return r;
}

// FULL: every element = f[0].
RefValue ref_FULL(const RefArgs& a) {
  RefValue r = ref_out(a.node);
  const double v = ref_round_to(a.node->dtype, double(a.params<FillParams>().value));
  for (double& e : r.v) e = v;
  return r;
}

// RAND_MASK: 1 where rng_uniform(seed, linear index) < f[0]; the optional i32 seed
// tensor's element 0 is xor-ed into the seed i[0].
RefValue ref_RAND_MASK(const RefArgs& a) {
  uint64_t seed = uint64_t(a.params<RandMaskParams>().seed);
  if (a.n_src > 0) {
    const RefValue& s = a.in(0);
    if (s.v.empty()) ref_fail(a.node, "empty seed tensor");
    seed ^= uint64_t(int64_t(s.v[0]));
  }
  RefValue r = ref_out(a.node);
  for (size_t k = 0; k < r.v.size(); ++k)
    r.v[k] = kiln::detail::rng_uniform(seed, k) < a.params<RandMaskParams>().keep ? 1.0 : 0.0;
  return r;
}

}  // namespace kiln::test
