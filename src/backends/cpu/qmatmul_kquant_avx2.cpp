// AVX2 dots of the k-quants' row-dot path (qmatmul_kquant.h) for Q4_K, Q5_K and
// Q6_K (Q2_K and Q3_K take the portable dot): 32 quants at a time unpacked to
// bytes, multiplied with the x quants by vpmaddubsw (unsigned W quant times
// signed x quant, pairs summed into int16: at most 63 * 127 * 2, no
// saturation), scaled per group by vpmaddwd into int32 lanes. The integers are
// the portable dot's, and so is the f32 update per block. Builds with AVX-512
// use these too (they have AVX2).
#include "backends/cpu/qmatmul_kquant.h"

#if defined(__AVX2__)
#include <immintrin.h>

#include <cstring>

#include "backends/cpu/gemm_convert.h"
#endif

namespace kiln::cpu::qmatmul_detail {

#if defined(__AVX2__)
namespace {

using gemm_detail::f16_at;

inline int32_t hsum(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// sum over the 32 values of q (unsigned bytes) * x (signed bytes), scaled by sc
// (all 32 values) or by sa (values 0..15) and sb (16..31), into int32 lanes.
inline __m256i scaled_dot(__m256i q, const int8_t* x, __m256i scale) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(q, load32(x)), scale);
}

// Q4_K/Q5_K's 8 scales and 8 mins (see k4_scale_min in qmatmul_kquant.cpp).
inline void k4_scales(const uint8_t* s, int* sc, int* m) {
  for (int g = 0; g < 4; ++g) {
    sc[g] = s[g] & 63;
    m[g] = s[g + 4] & 63;
    sc[g + 4] = (s[g + 8] & 15) | ((s[g] >> 6) << 4);
    m[g + 4] = (s[g + 8] >> 4) | ((s[g + 4] >> 6) << 4);
  }
}

template <bool Q5>
float dot_q4_q5_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  constexpr int64_t bytes = Q5 ? 176 : 144;
  const __m256i m4 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += bytes) {
    const BlockQ8K& xb = x[b];
    const uint8_t* qs = w + (Q5 ? 48 : 16);
    int sc[8], m[8];
    k4_scales(w + 4, sc, m);
    __m256i qh = _mm256_setzero_si256();
    if constexpr (Q5) qh = load32(w + 16);
    __m256i acc = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {  // groups 2p (low nibbles) and 2p + 1 (high)
      const __m256i q = load32(qs + 32 * p);
      __m256i lo = _mm256_and_si256(q, m4), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
      if constexpr (Q5) {
        lo = _mm256_or_si256(
            lo, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p)), one), 4));
        hi = _mm256_or_si256(
            hi, _mm256_slli_epi16(
                    _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * p + 1)), one), 4));
      }
      acc = _mm256_add_epi32(acc,
                             scaled_dot(lo, xb.qs + 64 * p, _mm256_set1_epi16(int16_t(sc[2 * p]))));
      acc = _mm256_add_epi32(
          acc, scaled_dot(hi, xb.qs + 64 * p + 32, _mm256_set1_epi16(int16_t(sc[2 * p + 1]))));
    }
    int32_t msum = 0;
    for (int g = 0; g < 8; ++g) msum += m[g] * (xb.bsums[2 * g] + xb.bsums[2 * g + 1]);
    const int32_t isum = hsum(acc);
    sum += xb.d * f16_at(w) * float(isum) - xb.d * f16_at(w + 2) * float(msum);
  }
  return sum;
}

float dot_q6_k(const uint8_t* w, const BlockQ8K* x, int64_t nb) {
  const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
  float sum = 0;
  for (int64_t b = 0; b < nb; ++b, w += 210) {
    const BlockQ8K& xb = x[b];
    const auto* sc = reinterpret_cast<const int8_t*>(w + 192);
    __m256i acc = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {  // values 128 h .. 128 h + 127
      const __m256i q0 = load32(w + 64 * h), q1 = load32(w + 64 * h + 32);
      const __m256i qh = load32(w + 128 + 32 * h);
      auto high = [&](int shift) {  // 2 bits of qh at `shift`, moved to bits 4-5
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, shift), m2), 4);
      };
      __m256i v[4];
      v[0] = _mm256_or_si256(_mm256_and_si256(q0, m4), high(0));
      v[1] = _mm256_or_si256(_mm256_and_si256(q1, m4), high(2));
      v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), m4), high(4));
      v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), m4), high(6));
      for (int q = 0; q < 4; ++q) {  // 32 values: groups 8h + 2q and 8h + 2q + 1
        const int g = 8 * h + 2 * q;
        const __m256i scale = _mm256_setr_m128i(_mm_set1_epi16(sc[g]), _mm_set1_epi16(sc[g + 1]));
        acc = _mm256_add_epi32(acc, scaled_dot(v[q], xb.qs + 128 * h + 32 * q, scale));
      }
    }
    // The quants are stored + 32: take 32 * scale * (sum of the group's x) off.
    int32_t off = 0;
    for (int g = 0; g < 16; ++g) off += sc[g] * xb.bsums[g];
    const int32_t isum = hsum(acc) - 32 * off;
    sum += xb.d * f16_at(w + 208) * float(isum);
  }
  return sum;
}

}  // namespace

KQuantDot kquant_dot_avx2(DType f) {
  switch (f) {
    case DType::q4_k: return dot_q4_q5_k<false>;
    case DType::q5_k: return dot_q4_q5_k<true>;
    case DType::q6_k: return dot_q6_k;
    default: return nullptr;
  }
}
#else
KQuantDot kquant_dot_avx2(DType) { return nullptr; }
#endif

}  // namespace kiln::cpu::qmatmul_detail
