// Reference: the fused convolution ops, straight from the definition
//   y[n,o,oh,ow] = sum_{c,kh,kw} x[n,c,oh*SH-PH+kh*DH, ow*SW-PW+kw*DW] * w[o,c,kh,kw]
// (zero padding). CONV2D_BACK_INPUT and CONV2D_BACK_WEIGHT are the same sum with
// the product's terms moved to the output.
#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

enum class Role { forward, back_input, back_weight };

// x, w, y: the shapes of input, weight and output; the two known operands come
// from a (in their op order), the third is the node.
RefValue conv_ref(const RefArgs& a, Role role) {
  const Conv2dParams p = a.params<Conv2dParams>();
  const int64_t KH = p.kh, KW = p.kw, SH = p.sh, SW = p.sw, PH = p.ph, PW = p.pw, DH = p.dh,
                DW = p.dw;
  if (KH < 1 || KW < 1 || SH < 1 || SW < 1 || PH < 0 || PW < 0 || DH < 1 || DW < 1)
    ref_fail(a.node, "bad window params");
  const Shape xs = role == Role::back_input ? a.node->shape : a.in(0).shape;
  const Shape ws = role == Role::back_weight ? a.node->shape : a.in(1).shape;
  if (xs.ndim() != 4 || ws.ndim() != 4 || xs[1] != ws[1]) ref_fail(a.node, "x / weight shapes");
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3], O = ws[0];
  const int64_t OH = (H + 2 * PH - DH * (KH - 1) - 1) / SH + 1;
  const int64_t OW = (W + 2 * PW - DW * (KW - 1) - 1) / SW + 1;
  const Shape ys{N, O, OH, OW};
  RefValue r = ref_out(a.node, role == Role::forward ? ys : role == Role::back_input ? xs : ws);
  const RefValue& s0 = a.in(0);
  const RefValue& s1 = a.in(1);
  if (!(s0.shape == (role == Role::back_input ? ys : xs)) ||
      !(s1.shape == (role == Role::back_weight ? ys : ws)))
    ref_fail(a.node, "operand shapes");
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow)
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < KH; ++kh)
              for (int64_t kw = 0; kw < KW; ++kw) {
                const int64_t h = oh * SH - PH + kh * DH, w = ow * SW - PW + kw * DW;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                const size_t xi = size_t(((n * C + c) * H + h) * W + w);
                const size_t wi = size_t(((o * C + c) * KH + kh) * KW + kw);
                const size_t yi = size_t(((n * O + o) * OH + oh) * OW + ow);
                switch (role) {
                  case Role::forward: r.v[yi] += s0.v[xi] * s1.v[wi]; break;
                  case Role::back_input: r.v[xi] += s0.v[yi] * s1.v[wi]; break;
                  case Role::back_weight: r.v[wi] += s0.v[xi] * s1.v[yi]; break;
                }
              }
  return r;
}

}  // namespace

RefValue ref_CONV2D(const RefArgs& a) { return conv_ref(a, Role::forward); }
RefValue ref_CONV2D_BACK_INPUT(const RefArgs& a) { return conv_ref(a, Role::back_input); }
RefValue ref_CONV2D_BACK_WEIGHT(const RefArgs& a) { return conv_ref(a, Role::back_weight); }

}  // namespace kiln::test
