// The k-quants' row-dot path in plain C++ (qmatmul_kquant.h): x rounded to
// BlockQ8K, each W block unpacked to one signed byte per value, integer
// products per group of 16, one f32 update per block. Layouts
// (ggml's, bit for bit; docs/adding-a-quant-type.md):
//   Q2_K  84 B: scales[16] (scale low nibble, min high), qs[64] (2 bits), d, dmin
//   Q3_K 110 B: hmask[32], qs[64] (low 2 bits), scales[12] (6-bit, +32), d
//   Q4_K 144 B: d, dmin, scales[12] (6-bit scale/min pairs), qs[128] (nibbles)
//   Q5_K 176 B: d, dmin, scales[12], qh[32] (5th bits), qs[128]
//   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
// In the 2-bit fields value v is bits 2 (v % 128 / 32) of byte v / 128 * 32 +
// v % 32; in the nibble fields value v is the low (v % 64 < 32) or high nibble
// of byte v / 64 * 32 + v % 32; a 5th / high bit of value v is bit v / 32 of
// byte v % 32 (Q3_K's hmask, Q5_K's qh).
#include "backends/cpu/qmatmul_kquant.h"

#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/qmatmul_round_x.h"
#include "kiln/error.h"

namespace kiln::cpu::qmatmul_detail {

void quantize_q8k(const float* x, BlockQ8K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    BlockQ8K& out = y[b];
    out.d = round_x_block(x, kQK, out.qs);
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int v = 0; v < 16; ++v) s += out.qs[16 * g + v];
      out.bsums[g] = int16_t(s);
    }
  }
}

namespace {

using gemm_detail::f16_at;

// Q4_K/Q5_K's 6-bit scale and min of group g (of 8) from the 12 scale bytes:
// groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins), groups
// 4-7 in the nibbles of bytes 8-11 plus the top 2 bits of bytes 0-7.
inline void k4_scale_min(const uint8_t* s, int g, int& sc, int& m) {
  if (g < 4) {
    sc = s[g] & 63;
    m = s[g + 4] & 63;
  } else {
    sc = (s[g + 4] & 15) | ((s[g - 4] >> 6) << 4);
    m = (s[g + 4] >> 4) | ((s[g] >> 6) << 4);
  }
}

// KUnpacked (qmatmul_kquant.h) of each format, written as plain loops over
// bytes so the compiler vectorizes them.
using Unpacked = KUnpacked;

void unpack_q2_k(const uint8_t* w, Unpacked& u) {
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l)
        u.q[128 * j + 32 * s + l] = int8_t((w[16 + 32 * j + l] >> (2 * s)) & 3);
  for (int g = 0; g < 16; ++g) u.sc[g] = w[g] & 15, u.mn[g] = w[g] >> 4;
  u.d = f16_at(w + 80), u.dmin = f16_at(w + 82);
}

// Q3_K's 6-bit scale of group g (of 16), offset by 32: the low 4 bits in the
// nibbles of bytes 0-7, the high 2 in bytes 8-11.
inline int q3_scale(const uint8_t* s, int g) {
  const int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
  return (lo | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
}

void unpack_q3_k(const uint8_t* w, Unpacked& u) {
  // Value v = 128 j + 32 s + l: low 2 bits at shift 2 s of byte 32 + 32 j + l,
  // the high bit (set: +0, clear: -4) bit v / 32 of hmask byte l.
  for (int j = 0; j < 2; ++j)
    for (int s = 0; s < 4; ++s)
      for (int l = 0; l < 32; ++l) {
        const int low = (w[32 + 32 * j + l] >> (2 * s)) & 3;
        const int high = (w[l] >> (4 * j + s)) & 1;
        u.q[128 * j + 32 * s + l] = int8_t(low - (high ? 0 : 4));
      }
  for (int g = 0; g < 16; ++g) u.sc[g] = q3_scale(w + 96, g), u.mn[g] = 0;
  u.d = f16_at(w + 108), u.dmin = 0;
}

template <bool Q5>
void unpack_q4_q5_k(const uint8_t* w, Unpacked& u) {
  const uint8_t* qs = w + (Q5 ? 48 : 16);
  for (int j = 0; j < 4; ++j)  // values 64 j + l (low nibbles) and 64 j + 32 + l (high)
    for (int l = 0; l < 32; ++l) {
      int lo = qs[32 * j + l] & 15, hi = qs[32 * j + l] >> 4;
      if (Q5) {
        lo |= ((w[16 + l] >> (2 * j)) & 1) << 4;
        hi |= ((w[16 + l] >> (2 * j + 1)) & 1) << 4;
      }
      u.q[64 * j + l] = int8_t(lo);
      u.q[64 * j + 32 + l] = int8_t(hi);
    }
  for (int g = 0; g < 8; ++g) {
    int sc, m;
    k4_scale_min(w + 4, g, sc, m);
    u.sc[2 * g] = u.sc[2 * g + 1] = sc;
    u.mn[2 * g] = u.mn[2 * g + 1] = m;
  }
  u.d = f16_at(w), u.dmin = f16_at(w + 2);
}

void unpack_q6_k(const uint8_t* w, Unpacked& u) {
  // Value 128 h + 32 quarter + l: low 4 bits from ql byte 64 h + 32 (quarter
  // & 1) + l (low nibble for quarters 0, 1, high for 2, 3), high 2 bits at
  // shift 2 quarter of qh byte 32 h + l; stored + 32.
  for (int h = 0; h < 2; ++h)
    for (int l = 0; l < 32; ++l) {
      const uint8_t* ql = w + 64 * h;
      const int qh = w[128 + 32 * h + l];
      int8_t* q = u.q + 128 * h + l;
      q[0] = int8_t(((ql[l] & 15) | ((qh & 3) << 4)) - 32);
      q[32] = int8_t(((ql[32 + l] & 15) | (((qh >> 2) & 3) << 4)) - 32);
      q[64] = int8_t(((ql[l] >> 4) | (((qh >> 4) & 3) << 4)) - 32);
      q[96] = int8_t(((ql[32 + l] >> 4) | (((qh >> 6) & 3) << 4)) - 32);
    }
  const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
  for (int g = 0; g < 16; ++g) u.sc[g] = sc[g], u.mn[g] = 0;
  u.d = f16_at(w + 208), u.dmin = 0;
}

// isum = sum over groups of 16 of sc * sum(q x), msum = sum of mn * (the
// group's x sum): exact in int32 (|isum| < 16 * 63 * 16 * 32 * 127).
inline void group_sums(const Unpacked& u, const BlockQ8K& x, int32_t& isum, int32_t& msum) {
  isum = 0, msum = 0;
  for (int g = 0; g < 16; ++g) {
    int32_t s = 0;
    for (int v = 0; v < 16; ++v) s += int32_t(u.q[16 * g + v]) * x.qs[16 * g + v];
    isum += u.sc[g] * s;
    msum += u.mn[g] * x.bsums[g];
  }
}

// Offsets of d and dmin (-1: none) in a block of each format.
template <void (*Unpack)(const uint8_t*, Unpacked&), int64_t Bytes, int DOff, int DminOff>
float dot_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  float sum = 0;
  Unpacked u;
  for (int64_t b = 0; b < nb; ++b, w += Bytes) {
    const BlockQ8K& xb = x[b];
    Unpack(w, u);
    int32_t isum, msum;
    group_sums(u, xb, isum, msum);
    if constexpr (DminOff >= 0)
      sum += xb.d * f16_at(w + DOff) * float(isum) - xb.d * f16_at(w + DminOff) * float(msum);
    else sum += xb.d * f16_at(w + DOff) * float(isum);
  }
  return sum;
}

}  // namespace

void kquant_unpack(DType f, const uint8_t* block, KUnpacked& u) {
  switch (f) {
    case DType::q2_k: return unpack_q2_k(block, u);
    case DType::q3_k: return unpack_q3_k(block, u);
    case DType::q4_k: return unpack_q4_q5_k<false>(block, u);
    case DType::q5_k: return unpack_q4_q5_k<true>(block, u);
    case DType::q6_k: return unpack_q6_k(block, u);
    default: KILN_ASSERT(false && "kquant_unpack: not a k-quant");
  }
}

KQuantDot kquant_dot_portable(DType f) {
  switch (f) {
    case DType::q2_k: return dot_k<unpack_q2_k, 84, 80, 82>;
    case DType::q3_k: return dot_k<unpack_q3_k, 110, 108, -1>;
    case DType::q4_k: return dot_k<unpack_q4_q5_k<false>, 144, 0, 2>;
    case DType::q5_k: return dot_k<unpack_q4_q5_k<true>, 176, 0, 2>;
    case DType::q6_k: return dot_k<unpack_q6_k, 210, 208, -1>;
    default: return nullptr;
  }
}

KQuantDot kquant_dot(DType f) {
  if (KQuantDot d = kquant_dot_avx2(f)) return d;
  return kquant_dot_portable(f);
}

}  // namespace kiln::cpu::qmatmul_detail
