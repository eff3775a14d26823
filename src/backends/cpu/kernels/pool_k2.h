// The vector path of the pooling kernels (pool.cpp) for 2x2 windows, stride 2,
// no padding, over rows that are contiguous along W: output column ow reads input
// columns 2ow and 2ow+1 of rows 2oh and 2oh+1. Windows go vm::kW at a time (a
// partial last chunk). The results are the generic loops' floats, bit for bit.
#pragma once
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/window.h"

namespace kiln::cpu::pool_k2 {

using vm::VF;
using window::Planes;
using window::Window;

// The first n >= 1 floats at p in the lanes of a VF; the other lanes are junk.
// A whole vector is loaded wherever the tensor's memory (ending at `end`) goes
// on that far, a masked one only at its very end: masked loads that miss the
// cache are slow on some CPUs (2-3x here, AMD EPYC, on rows of 14 floats).
inline VF load_part(const float* p, int64_t n, const char* end) {
  if (n >= vm::kW || end - reinterpret_cast<const char*>(p) >= int64_t(sizeof(VF)))
    return vm::loadv<VF>(p);
  return vm::loadv<VF>(p, int(n));
}
// Stores the first n >= 1 lanes of v at p: the whole vector (masked stores are
// slow there too) where the caller promises that it writes every float up to
// `end` later, over the junk lanes; else masked.
inline void store_part(float* p, VF v, int64_t n, const float* end) {
  if (n >= vm::kW || end - p >= vm::kW) vm::store(p, v);
  else vm::store(p, v, int(n));
}

#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))  // VF is a vector

// Even and odd floats of the 2*kW floats lo:hi, and the inverse.
inline void unzip(VF lo, VF hi, VF& even, VF& odd) {
#if defined(__AVX512F__)
  const __m512i ie = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i io = _mm512_add_epi32(ie, _mm512_set1_epi32(1));
  even.v = _mm512_permutex2var_ps(lo.v, ie, hi.v);
  odd.v = _mm512_permutex2var_ps(lo.v, io, hi.v);
#else
  // shuffle_ps works per 128-bit half; the 64-bit permute puts the halves in order.
  const __m256 e = _mm256_shuffle_ps(lo.v, hi.v, 0x88), o = _mm256_shuffle_ps(lo.v, hi.v, 0xdd);
  even.v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(e), 0xd8));
  odd.v = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(o), 0xd8));
#endif
}
inline void zip(VF even, VF odd, VF& lo, VF& hi) {
#if defined(__AVX512F__)
  const __m512i il = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  const __m512i ih = _mm512_add_epi32(il, _mm512_set1_epi32(8));
  lo.v = _mm512_permutex2var_ps(even.v, il, odd.v);
  hi.v = _mm512_permutex2var_ps(even.v, ih, odd.v);
#else
  const __m256 l = _mm256_unpacklo_ps(even.v, odd.v), h = _mm256_unpackhi_ps(even.v, odd.v);
  lo.v = _mm256_permute2f128_ps(l, h, 0x20);
  hi.v = _mm256_permute2f128_ps(l, h, 0x31);
#endif
}

// Left and right columns of m (1..kW) windows along the row p (lanes past m junk).
inline void load_cols(const float* p, int m, const char* end, VF& left, VF& right) {
  const VF lo = load_part(p, 2 * m, end);
  const VF hi = 2 * m > vm::kW ? load_part(p + vm::kW, 2 * m - vm::kW, end) : vm::c<VF>(0.0f);
  unzip(lo, hi, left, right);
}
inline void store_cols(float* p, int m, const float* end, VF left, VF right) {
  VF lo, hi;
  zip(left, right, lo, hi);
  store_part(p, lo, 2 * m, end);
  if (2 * m > vm::kW) store_part(p + vm::kW, hi, 2 * m - vm::kW, end);
}
#else  // VF is one float: one window at a time
inline void load_cols(const float* p, int, const char*, VF& left, VF& right) {
  left = {p[0]};
  right = {p[1]};
}
inline void store_cols(float* p, int, const float*, VF left, VF right) {
  p[0] = left.v;
  p[1] = right.v;
}
#endif

// The four elements of m windows, in row-major order: a b / c d.
struct Quad {
  VF a, b, c, d;
};
inline void store_quad(float* r0, float* r1, int m, const float* end, const Quad& q) {
  store_cols(r0, m, end, q.a, q.b);
  store_cols(r1, m, end, q.c, q.d);
}

// window_argmax's rule (pool.cpp) without its serial chain of compares. A NaN
// beats every number and no later value replaces it, so a window holding a NaN
// yields its first NaN. Otherwise it yields its first element equal to the
// maximum, which a chain of x86 max finds: max(v, best) is v > best ? v : best,
// so of equal values (+0 and -0 too) the earlier one stays.
inline VF max_chain(const Quad& q) { return vm::max(q.d, vm::max(q.c, vm::max(q.b, q.a))); }

// Cheap test for the common case: a NaN makes the sum NaN (an inf - inf sum
// sends a chunk down the NaN path too, which is still exact).
inline bool may_hold_nan(const Quad& q) { return vm::any(vm::isnan((q.a + q.b) + (q.c + q.d))); }

struct Nans {
  vm::VM a, b, c, d, any;
};
inline Nans nans(const Quad& q) {
  Nans n{vm::isnan(q.a), vm::isnan(q.b), vm::isnan(q.c), vm::isnan(q.d), {}};
  n.any = (n.a | n.b) | (n.c | n.d);
  return n;
}

// Value of each window's first maximum.
inline VF first_max(const Quad& q) {
  const VF m = max_chain(q);
  if (!may_hold_nan(q)) return m;
  const Nans n = nans(q);
  return vm::select(n.any, vm::select(n.a, q.a, vm::select(n.b, q.b, vm::select(n.c, q.c, q.d))),
                    m);
}

// g at each window's first maximum, 0 at its other elements.
inline Quad route_to_max(const Quad& q, VF g) {
  const VF m = max_chain(q), zero = vm::c<VF>(0.0f);
  vm::VM ca, cb, cc;  // candidates: the elements equal to the maximum, or the NaNs
  if (!may_hold_nan(q)) {
    ca = q.a == m, cb = q.b == m, cc = q.c == m;
  } else {  // a window holding NaNs compares with NaN, equal to nothing
    const Nans n = nans(q);
    const VF mn = vm::select(n.any, vm::c<VF>(std::numeric_limits<float>::quiet_NaN()), m);
    ca = n.a | (q.a == mn), cb = n.b | (q.b == mn), cc = n.c | (q.c == mn);
  }
  const vm::VM tb = cb & ~ca, tc = cc & ~(ca | cb), td = ~(ca | cb | cc);  // the first one takes g
  return {vm::select(ca, g, zero), vm::select(tb, g, zero), vm::select(tc, g, zero),
          vm::select(td, g, zero)};
}

// The generic loops' sum: from 0 (so -0 inputs give +0), in row-major order.
inline VF sum(const Quad& q) { return (((vm::c<VF>(0.0f) + q.a) + q.b) + q.c) + q.d; }

inline bool applies(const Window& win, const Planes& x, int64_t h, int64_t w, int64_t oh_n,
                    int64_t ow_n) {
  return win.kh == 2 && win.kw == 2 && win.sh == 2 && win.sw == 2 && win.ph == 0 && win.pw == 0 &&
         x.sw == 4 && oh_n == h / 2 && ow_n == w / 2;
}

// One past the last byte of t's elements (strides >= 0; else t's start, which
// keeps every partial load masked).
inline const char* data_end(const TensorNode* t) {
  const char* p = static_cast<const char*>(t->data);
  int64_t last = 0;
  for (int d = 0; d < t->shape.ndim(); ++d) {
    if (t->stride[d] < 0) return p;
    last += (t->shape[d] - 1) * t->stride[d];
  }
  return p + last + int64_t(t->elem_size());
}

// One (n, c) plane of an input whose W stride is one float.
struct Plane {
  const char* base;
  int64_t sh;
  const char* end;  // data_end of the tensor
  const float* row(int64_t ih) const { return reinterpret_cast<const float*>(base + ih * sh); }
  // The four elements of windows (oh, ow..ow+m).
  Quad quad(int64_t oh, int64_t ow, int m) const {
    Quad q;
    load_cols(row(2 * oh) + 2 * ow, m, end, q.a, q.b);
    load_cols(row(2 * oh + 1) + 2 * ow, m, end, q.c, q.d);
    return q;
  }
  // Elements (oh, ow..ow+m), for a plane of the pool's output gradient.
  VF chunk(int64_t oh, int64_t ow, int m) const { return load_part(row(oh) + ow, m, end); }
};

// A pool input (or output gradient) on the k2 path.
struct Input {
  Planes x;
  int64_t c_in;
  const char* end;
  explicit Input(const TensorNode* t) : x(t), c_in(t->shape[1]), end(data_end(t)) {}
  Plane plane(int64_t pl) const { return {x.plane(pl / c_in, pl % c_in), x.sh, end}; }
};

// The output rows `rows` of dst ([*, oh_n, ow_n], contiguous); f(Quad) gives a
// chunk of windows' results.
template <class F>
void gather_rows(const Input& in, int64_t oh_n, int64_t ow_n, float* dst,
                 std::pair<int64_t, int64_t> rows, F f) {
  const float* d_end = dst + rows.second * ow_n;  // written in order up to here
  for (int64_t r = rows.first; r < rows.second;) {
    const int64_t pl = r / oh_n, plane_end = std::min(rows.second, (pl + 1) * oh_n);
    const Plane x = in.plane(pl);
    for (; r < plane_end; ++r) {
      const int64_t oh = r - pl * oh_n;
      float* d = dst + r * ow_n;
      for (int64_t ow = 0; ow < ow_n; ow += vm::kW) {
        const int m = int(std::min<int64_t>(vm::kW, ow_n - ow));
        store_part(d + ow, f(x.quad(oh, ow, m)), m, d_end);
      }
    }
  }
}

// Every element of the dst planes `planes` ([*, h, w], contiguous). f(pl) gives
// plane pl's chunk function: c(oh, ow, m) is the Quad of the four elements under
// outputs (oh, ow..ow+m). The last row / column, when h / w is odd, is covered by
// no window: zeros.
template <class F>
void write_planes(float* dst, int64_t h, int64_t w, int64_t oh_n, int64_t ow_n,
                  std::pair<int64_t, int64_t> planes, F f) {
  // Whole-vector stores of partial chunks need every float after them (up to
  // d_end) to be written later. With one chunk a row that holds (row 2oh+1 right
  // after row 2oh, then the rest in order); with more, row 2oh+1's first chunk
  // comes before row 2oh's last one, so partial chunks stay masked.
  const float* d_end = ow_n <= vm::kW ? dst + planes.second * h * w : dst;
  for (int64_t pl = planes.first; pl < planes.second; ++pl) {
    const auto chunk = f(pl);
    float* d = dst + pl * h * w;
    for (int64_t oh = 0; oh < oh_n; ++oh) {
      float* d0 = d + 2 * oh * w;
      float* d1 = d0 + w;
      for (int64_t ow = 0; ow < ow_n; ow += vm::kW) {
        const int m = int(std::min<int64_t>(vm::kW, ow_n - ow));
        store_quad(d0 + 2 * ow, d1 + 2 * ow, m, d_end, chunk(oh, ow, m));
      }
      if (w > 2 * ow_n) d0[w - 1] = d1[w - 1] = 0.0f;
    }
    if (h > 2 * oh_n) std::fill(d + (h - 1) * w, d + h * w, 0.0f);
  }
}

// The generic scatters add each value to a zeroed dst: 0 + v, which is v except
// that -0 becomes +0 (and a signaling NaN quiet). plus0 does the same add.
inline VF plus0(VF v) { return v + vm::c<VF>(0.0f); }
// plus0 of a product, as a select: an add would be fused with the multiply into
// an FMA, which keeps the sign of a product that underflows to -0.
inline VF plus0_product(VF v) {
  const VF zero = vm::c<VF>(0.0f);
  return vm::select(v == zero, zero, v);
}

}  // namespace kiln::cpu::pool_k2
