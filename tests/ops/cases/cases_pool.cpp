// Cases: max/avg pooling (padding, overlapping windows) and their backward ops.
#include <cmath>
#include <limits>

#include "kiln/ext/op_params.h"
#include "ops/cases/case_specs.h"
#include "ops/harness/case.h"

namespace kiln::test {

namespace {

using X = const std::vector<Tensor>&;

// PyTorch pooling: max pads with -inf; avg counts padding as zeros (divides by kh*kw).
SpecFn pool_spec(Win w, bool is_max) {
  return [w, is_max](const std::vector<RefValue>& in, const RefValue& out) {
    const RefValue& x = in[0];
    const int64_t N = x.shape[0], C = x.shape[1], H = x.shape[2], W = x.shape[3];
    const int64_t OH = osz(H, w.kh, w.sh, w.ph, 1), OW = osz(W, w.kw, w.sw, w.pw, 1);
    RefValue r = ref_value({N, C, OH, OW}, {});
    for (int64_t nc = 0; nc < N * C; ++nc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double m = -std::numeric_limits<double>::infinity(), s = 0;
          for (int64_t i = 0; i < w.kh; ++i)
            for (int64_t j = 0; j < w.kw; ++j) {
              const int64_t h = oh * w.sh - w.ph + i, ww = ow * w.sw - w.pw + j;
              if (h < 0 || h >= H || ww < 0 || ww >= W) continue;
              const double v = x.v[size_t((nc * H + h) * W + ww)];
              m = std::max(m, v);
              s += v;
            }
          r.v.push_back(is_max ? m : s / double(w.kh * w.kw));
        }
    return spec_compare(r, out);
  };
}

void add_pools(std::vector<Case>& cs, Sz z) {
  const int64_t B = z(1, 8), C = z(2, 32), H = z(4, 64);
  const Gen g = gen::distinct(-3, 3);  // no ties: FD-stable maxima
  struct Pl {
    const char* name;
    Input x;
    Win w;
    bool defaults;  // use Pool2dOptions' defaults (kernel 2, stride = kernel)
  };
  const Pl pls[] = {
      {"default", in("x", {B, C, H, H}, g), {2, 2, 2, 2, 0, 0}, true},
      {"k3_s2_p1", in("x", {2, 1, H + 1, H + 1}, g), {3, 3, 2, 2, 1, 1}, false},
      {"rect", in("x", {B, C, H + 1, H + 2}, g), {2, 3, 1, 2, 1, 1}, false},
      {"overlap_s1", in("x", {B, 1, H, H + 1}, g), {2, 2, 1, 1, 0, 0}, false},
      {"strided_input",
       with(in("x", {B, C, H, H + 2}, g), Layout::transposed),
       {2, 2, 2, 2, 0, 0},
       false},
      {"negative_padded", in("x", {B, C, H, H}, gen::distinct(-9, -1)), {3, 3, 1, 1, 1, 1}, false},
      {"larger", in("x", {1, 2, z(11, 64), z(13, 64)}, g), {3, 3, 2, 2, 1, 1}, false},
      // 2x2 stride 2 has its own vector path: odd H and W leave the last row and
      // column outside every window; 17 windows a row end in a partial vector.
      {"k2_s2_odd", in("x", {B, C, H + 1, H + 3}, g), {2, 2, 2, 2, 0, 0}, false},
      {"k2_s2_wide", in("x", {1, 2, 4, 35}, g), {2, 2, 2, 2, 0, 0}, false},
      {"k2_s2_narrowed",
       with(in("x", {B, C, H + 1, 35}, g), Layout::narrowed),
       {2, 2, 2, 2, 0, 0},
       false},
  };
  for (int is_max = 1; is_max >= 0; --is_max) {
    for (const Pl& pl : pls) {
      const Win w = pl.w;
      const bool defaults = pl.defaults;
      auto build = [w, defaults, is_max](Context&, X x) {
        Pool2dOptions o;
        if (!defaults) {
          o.kernel[0] = w.kh, o.kernel[1] = w.kw;
          o.stride[0] = w.sh, o.stride[1] = w.sw;
          o.padding[0] = w.ph, o.padding[1] = w.pw;
        }
        return is_max ? max_pool2d(x[0], o) : avg_pool2d(x[0], o);
      };
      Case c = make_case(std::string(is_max ? "max_pool2d_" : "avg_pool2d_") + pl.name,
                         {is_max ? Op::MAX_POOL2D : Op::AVG_POOL2D}, {pl.x}, build, true);
      c.spec = pool_spec(w, is_max);
      cs.push_back(c);
    }
    // Big enough to split over 2 and 3 threads (their results must be bit-identical).
    const Win k2{2, 2, 2, 2, 0, 0};
    Case big = make_case(
        std::string(is_max ? "max_pool2d_" : "avg_pool2d_") + "k2_s2_threads",
        {is_max ? Op::MAX_POOL2D : Op::AVG_POOL2D}, {in("x", {8, 8, 28, 29}, g)},
        [is_max](Context&, X x) { return is_max ? max_pool2d(x[0]) : avg_pool2d(x[0]); }, true);
    big.fd = false;
    big.spec = pool_spec(k2, is_max);
    cs.push_back(big);
  }
  // The backward ops directly. Ties in x (-0 and +0 too): the first maximum
  // (row-major) of each window gets the window's gradient.
  auto pool_params = [](Win w) { return Pool2dParams{w.kh, w.kw, w.sh, w.sw, w.ph, w.pw}; };
  struct Bk {
    const char* name;
    Shape x;
    Win w;
  };
  const Bk bks[] = {
      {"k2_s2", {B, C, H, H}, {2, 2, 2, 2, 0, 0}},
      {"k3_s1_p1_overlap", {B, C, H, H + 1}, {3, 3, 1, 1, 1, 1}},
      {"k2_s2_odd_wide", {B, C, H + 1, 35}, {2, 2, 2, 2, 0, 0}},
  };
  for (const Bk& bk : bks) {
    const Win w = bk.w;
    const Shape go{bk.x[0], bk.x[1], osz(bk.x[2], w.kh, w.sh, w.ph, 1),
                   osz(bk.x[3], w.kw, w.sw, w.pw, 1)};
    const Shape xs = bk.x;
    Case mb = make_case(
        std::string("max_pool2d_back_ties_") + bk.name, {Op::MAX_POOL2D_BACK},
        {constant(in("x", xs, gen::choice({-0.0, 0, 1, 1, 2}))), in("grad", go)},
        [w, xs, pool_params](Context&, X x) {
          return detail::make_op(Op::MAX_POOL2D_BACK, DType::f32, xs, {x[0], x[1]}, pool_params(w));
        },
        false);
    cs.push_back(mb);
    cs.push_back(make_case(
        std::string("avg_pool2d_back_") + bk.name, {Op::AVG_POOL2D_BACK}, {in("grad", go)},
        [w, xs, pool_params](Context&, X x) {
          return detail::make_op(Op::AVG_POOL2D_BACK, DType::f32, xs, {x[0]}, pool_params(w));
        },
        true));
  }
}
}  // namespace

void add_pool_cases(std::vector<Case>& cs, Sz z) { add_pools(cs, z); }

}  // namespace kiln::test
