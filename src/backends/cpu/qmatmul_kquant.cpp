// The k-quants' row-dot path in plain C++ (qmatmul_kquant.h): x rounded to
// BlockQ8K, integer products per group, one f32 update per block. Layouts
// (ggml's, bit for bit; docs/adding-a-quant-type.md):
//   Q2_K  84 B: scales[16] (scale low nibble, min high), qs[64] (2 bits), d, dmin
//   Q3_K 110 B: hmask[32], qs[64] (low 2 bits), scales[12] (6-bit, +32), d
//   Q4_K 144 B: d, dmin, scales[12] (6-bit scale/min pairs), qs[128] (nibbles)
//   Q5_K 176 B: d, dmin, scales[12], qh[32] (5th bits), qs[128]
//   Q6_K 210 B: ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] (int8), d
// In the 2-bit fields value v is bits 2 (v % 128 / 32) of byte v / 128 * 32 +
// v % 32; in the nibble fields value v is the low (v % 64 < 32) or high nibble
// of byte v / 64 * 32 + v % 32.
#include "backends/cpu/qmatmul_kquant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/gemm_convert.h"

namespace kiln::cpu::qmatmul_detail {

void quantize_q8k(const float* x, BlockQ8K* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b, x += kQK) {
    BlockQ8K& out = y[b];
    float amax = 0;
    bool finite = true;
    for (int v = 0; v < kQK; ++v) {
      const float a = std::abs(x[v]);
      finite = finite && a <= std::numeric_limits<float>::max();  // false for inf, NaN
      amax = std::max(amax, a);
    }
    const float inv = 127 / amax;
    std::memset(out.qs, 0, sizeof(out.qs));
    if (!finite) {
      out.d = std::numeric_limits<float>::quiet_NaN();
    } else if (!std::isfinite(inv)) {  // amax < ~1e-36 (or 0): the block rounds to 0
      out.d = 0;
    } else {
      out.d = amax / 127;
      for (int v = 0; v < kQK; ++v)
        out.qs[v] = int8_t(std::clamp(std::nearbyint(x[v] * inv), -127.f, 127.f));
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int v = 0; v < 16; ++v) s += out.qs[16 * g + v];
      out.bsums[g] = int16_t(s);
    }
  }
}

namespace {

using gemm_detail::f16_bits_to_f32;

inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_bits_to_f32(h);
}

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

inline int nibble(const uint8_t* qs, int v) {
  const uint8_t b = qs[v / 64 * 32 + v % 32];
  return v % 64 < 32 ? b & 15 : b >> 4;
}
inline int crumb(const uint8_t* qs, int v) {  // a 2-bit field
  return (qs[v / 128 * 32 + v % 32] >> (2 * (v % 128 / 32))) & 3;
}

// Sum of the x quants of 32-value group g (two 16-sums).
inline int xsum32(const BlockQ8K& x, int g) { return x.bsums[2 * g] + x.bsums[2 * g + 1]; }

float dot_q2_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += 84) {
    const BlockQ8K& xb = x[b];
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int v = 16 * g; v < 16 * g + 16; ++v) s += crumb(w + 16, v) * xb.qs[v];
      isum += (w[g] & 15) * s;
      msum += (w[g] >> 4) * xb.bsums[g];
    }
    sum += xb.d * f16_at(w + 80) * float(isum) - xb.d * f16_at(w + 82) * float(msum);
  }
  return sum;
}

// Q3_K's 6-bit scale of group g (of 16), offset by 32: the low 4 bits in the
// nibbles of bytes 0-7, the high 2 in bytes 8-11.
inline int q3_scale(const uint8_t* s, int g) {
  const int lo = g < 8 ? s[g] & 15 : s[g - 8] >> 4;
  return (lo | (((s[8 + g % 4] >> (2 * (g / 4))) & 3) << 4)) - 32;
}

float dot_q3_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += 110) {
    const BlockQ8K& xb = x[b];
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int v = 16 * g; v < 16 * g + 16; ++v) {
        const int high = (w[v % 32] >> (v / 32)) & 1;
        s += (crumb(w + 32, v) - (high ? 0 : 4)) * xb.qs[v];
      }
      isum += q3_scale(w + 96, g) * s;
    }
    sum += xb.d * f16_at(w + 108) * float(isum);
  }
  return sum;
}

template <bool Q5>
float dot_q4_q5_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  constexpr int64_t bytes = Q5 ? 176 : 144;
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += bytes) {
    const BlockQ8K& xb = x[b];
    const uint8_t* qs = w + (Q5 ? 48 : 16);
    int32_t isum = 0, msum = 0;
    for (int g = 0; g < 8; ++g) {
      int sc, m;
      k4_scale_min(w + 4, g, sc, m);
      int s = 0;
      for (int v = 32 * g; v < 32 * g + 32; ++v) {
        int q = nibble(qs, v);
        if (Q5) q += ((w[16 + v % 32] >> (v / 32)) & 1) << 4;
        s += q * xb.qs[v];
      }
      isum += sc * s;
      msum += m * xsum32(xb, g);
    }
    sum += xb.d * f16_at(w) * float(isum) - xb.d * f16_at(w + 2) * float(msum);
  }
  return sum;
}

float dot_q6_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    const BlockQ8K& xb = x[b];
    const auto* scales = reinterpret_cast<const int8_t*>(w + 192);
    int32_t isum = 0;
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int v = 16 * g; v < 16 * g + 16; ++v) {
        const int half = v / 128, quarter = v % 128 / 32, l = v % 32;
        const uint8_t low = w[64 * half + 32 * (quarter & 1) + l];
        const int lo4 = quarter < 2 ? low & 15 : low >> 4;
        const int hi2 = (w[128 + 32 * half + l] >> (2 * quarter)) & 3;
        s += ((lo4 | (hi2 << 4)) - 32) * xb.qs[v];
      }
      isum += scales[g] * s;
    }
    sum += xb.d * f16_at(w + 208) * float(isum);
  }
  return sum;
}

}  // namespace

KQuantDot kquant_dot_portable(DType f) {
  switch (f) {
    case DType::q2_k: return dot_q2_k;
    case DType::q3_k: return dot_q3_k;
    case DType::q4_k: return dot_q4_q5_k<false>;
    case DType::q5_k: return dot_q4_q5_k<true>;
    case DType::q6_k: return dot_q6_k;
    default: return nullptr;
  }
}

KQuantDot kquant_dot(DType f) {
  if (KQuantDot d = kquant_dot_avx2(f)) return d;
  return kquant_dot_portable(f);
}

}  // namespace kiln::cpu::qmatmul_detail
