// The vector types under vec_math.h (namespace kiln::cpu::vm):
//   VF  the widest native float vector: 16 lanes with AVX-512F, 8 with AVX2+FMA,
//       otherwise VF is SF. kW is its lane count.
//   SF  one float with the same interface, so code written once over a type V
//       in {VF, SF} (concept Vec) has a vector and a scalar form. VI/SI are the
//       matching int32 vectors, VM/SM the lane masks (V::I, V::M).
// Operations: arithmetic operators, madd (a*b+c, fused), min/max (x86 NaN
// semantics: the second operand wins), abs, sqrt, round_even, comparisons
// (-> masks; != is true for NaN), select, bit casts (as_int/as_float), int
// conversions and shifts, masked partial load/store (tails), hsum/hmax,
// non-temporal stream() + stream_fence().
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::vm {

// ---------------------------------------------------------------- scalar type
struct SM {
  bool v;
};
struct SI {
  int32_t v;
};
struct SF {
  using I = SI;
  using M = SM;
  static constexpr int W = 1;
  float v;
};
inline SF set1(SF, float x) { return {x}; }
inline SF load(SF, const float* p) { return {*p}; }
inline SF load(SF, const float* p, int n) { return {n > 0 ? *p : 0.0f}; }
inline void store(float* p, SF a) { *p = a.v; }
inline void store(float* p, SF a, int n) {
  if (n > 0) *p = a.v;
}
inline SF operator+(SF a, SF b) { return {a.v + b.v}; }
inline SF operator-(SF a, SF b) { return {a.v - b.v}; }
inline SF operator*(SF a, SF b) { return {a.v * b.v}; }
inline SF operator/(SF a, SF b) { return {a.v / b.v}; }
inline SF operator-(SF a) { return {-a.v}; }
// a*b + c: fused where the target has fast FMA (x86 without FMA would call a slow
// software fmaf, so it rounds twice there instead).
#if defined(__FP_FAST_FMAF) || defined(__FMA__)
#define KILN_VM_FAST_FMA 1
inline SF madd(SF a, SF b, SF c) { return {std::fma(a.v, b.v, c.v)}; }
#else
#define KILN_VM_FAST_FMA 0
inline SF madd(SF a, SF b, SF c) { return {a.v * b.v + c.v}; }
#endif
// min/max follow x86 semantics: the second operand is returned if either is NaN.
inline SF min(SF a, SF b) { return {a.v < b.v ? a.v : b.v}; }
inline SF max(SF a, SF b) { return {a.v > b.v ? a.v : b.v}; }
inline SF abs(SF a) { return {std::fabs(a.v)}; }
inline SF sqrt(SF a) { return {std::sqrt(a.v)}; }
inline SF round_even(SF a) { return {std::nearbyint(a.v)}; }
inline SM operator<(SF a, SF b) { return {a.v < b.v}; }
inline SM operator<=(SF a, SF b) { return {a.v <= b.v}; }
inline SM operator>(SF a, SF b) { return {a.v > b.v}; }
inline SM operator>=(SF a, SF b) { return {a.v >= b.v}; }
inline SM operator==(SF a, SF b) { return {a.v == b.v}; }
inline SM operator!=(SF a, SF b) { return {a.v != b.v}; }  // true for NaN
inline SM isnan(SF a) { return {a.v != a.v}; }
inline SM operator&(SM a, SM b) { return {a.v && b.v}; }
inline SM operator|(SM a, SM b) { return {a.v || b.v}; }
inline SM operator~(SM a) { return {!a.v}; }
inline bool any(SM m) { return m.v; }
inline bool all(SM m) { return m.v; }
inline SF select(SM m, SF a, SF b) { return m.v ? a : b; }
inline SI select(SM m, SI a, SI b) { return m.v ? a : b; }
inline SI as_int(SF a) {
  SI r;
  std::memcpy(&r.v, &a.v, 4);
  return r;
}
inline SF as_float(SI a) {
  SF r;
  std::memcpy(&r.v, &a.v, 4);
  return r;
}
inline SI to_int(SF a) { return {int32_t(std::nearbyint(a.v))}; }  // |a| < 2^31
inline SF to_float(SI a) { return {float(a.v)}; }
inline SI set1(SI, int32_t x) { return {x}; }
inline SI operator+(SI a, SI b) { return {int32_t(uint32_t(a.v) + uint32_t(b.v))}; }
inline SI operator-(SI a, SI b) { return {int32_t(uint32_t(a.v) - uint32_t(b.v))}; }
inline SI operator&(SI a, SI b) { return {a.v & b.v}; }
inline SI operator|(SI a, SI b) { return {a.v | b.v}; }
inline SI operator^(SI a, SI b) { return {a.v ^ b.v}; }
template <int S>
inline SI shl(SI a) {
  return {int32_t(uint32_t(a.v) << S)};
}
template <int S>
inline SI shr(SI a) {
  return {int32_t(uint32_t(a.v) >> S)};
}  // logical
template <int S>
inline SI sra(SI a) {
  return {a.v >> S};
}  // arithmetic
inline SM operator==(SI a, SI b) { return {a.v == b.v}; }
inline SM operator>(SI a, SI b) { return {a.v > b.v}; }
inline float hsum(SF a) { return a.v; }
inline float hmax(SF a) { return a.v; }
// Non-temporal store of a full vector to p aligned to its size (see stream_fence).
inline void stream(float* p, SF a) { *p = a.v; }

// ---------------------------------------------------------------- native vector
#if defined(__AVX512F__)
inline constexpr int kW = 16;
struct VM {
  __mmask16 v;
};
struct VI {
  __m512i v;
};
struct VF {
  using I = VI;
  using M = VM;
  static constexpr int W = 16;
  __m512 v;
};
inline __mmask16 tail_mask(int n) { return n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1); }
inline VF set1(VF, float x) { return {_mm512_set1_ps(x)}; }
inline VF load(VF, const float* p) { return {_mm512_loadu_ps(p)}; }
inline VF load(VF, const float* p, int n) { return {_mm512_maskz_loadu_ps(tail_mask(n), p)}; }
inline void store(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline void store(float* p, VF a, int n) { _mm512_mask_storeu_ps(p, tail_mask(n), a.v); }
inline VF operator+(VF a, VF b) { return {_mm512_add_ps(a.v, b.v)}; }
inline VF operator-(VF a, VF b) { return {_mm512_sub_ps(a.v, b.v)}; }
inline VF operator*(VF a, VF b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline VF operator/(VF a, VF b) { return {_mm512_div_ps(a.v, b.v)}; }
inline VF operator-(VF a) {
  return {_mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(int(0x80000000u))))};
}
inline VF madd(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VF min(VF a, VF b) { return {_mm512_min_ps(a.v, b.v)}; }
inline VF max(VF a, VF b) { return {_mm512_max_ps(a.v, b.v)}; }
inline VF abs(VF a) {
  return {_mm512_castsi512_ps(
      _mm512_and_si512(_mm512_castps_si512(a.v), _mm512_set1_epi32(0x7fffffff)))};
}
inline VF sqrt(VF a) { return {_mm512_sqrt_ps(a.v)}; }
inline VF round_even(VF a) {
  return {_mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline VM operator<(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LT_OQ)}; }
inline VM operator<=(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_LE_OQ)}; }
inline VM operator>(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GT_OQ)}; }
inline VM operator>=(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_GE_OQ)}; }
inline VM operator==(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_EQ_OQ)}; }
inline VM operator!=(VF a, VF b) { return {_mm512_cmp_ps_mask(a.v, b.v, _CMP_NEQ_UQ)}; }
inline VM isnan(VF a) { return {_mm512_cmp_ps_mask(a.v, a.v, _CMP_UNORD_Q)}; }
inline VM operator&(VM a, VM b) { return {__mmask16(a.v & b.v)}; }
inline VM operator|(VM a, VM b) { return {__mmask16(a.v | b.v)}; }
inline VM operator~(VM a) { return {__mmask16(~a.v)}; }
inline bool any(VM m) { return m.v != 0; }
inline bool all(VM m) { return m.v == 0xffff; }
inline VF select(VM m, VF a, VF b) { return {_mm512_mask_blend_ps(m.v, b.v, a.v)}; }
inline VI select(VM m, VI a, VI b) { return {_mm512_mask_blend_epi32(m.v, b.v, a.v)}; }
inline VI as_int(VF a) { return {_mm512_castps_si512(a.v)}; }
inline VF as_float(VI a) { return {_mm512_castsi512_ps(a.v)}; }
inline VI to_int(VF a) { return {_mm512_cvtps_epi32(a.v)}; }
inline VF to_float(VI a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline VI set1(VI, int32_t x) { return {_mm512_set1_epi32(x)}; }
inline VI operator+(VI a, VI b) { return {_mm512_add_epi32(a.v, b.v)}; }
inline VI operator-(VI a, VI b) { return {_mm512_sub_epi32(a.v, b.v)}; }
inline VI operator&(VI a, VI b) { return {_mm512_and_si512(a.v, b.v)}; }
inline VI operator|(VI a, VI b) { return {_mm512_or_si512(a.v, b.v)}; }
inline VI operator^(VI a, VI b) { return {_mm512_xor_si512(a.v, b.v)}; }
template <int S>
inline VI shl(VI a) {
  return {_mm512_slli_epi32(a.v, S)};
}
template <int S>
inline VI shr(VI a) {
  return {_mm512_srli_epi32(a.v, S)};
}
template <int S>
inline VI sra(VI a) {
  return {_mm512_srai_epi32(a.v, S)};
}
inline VM operator==(VI a, VI b) { return {_mm512_cmpeq_epi32_mask(a.v, b.v)}; }
inline VM operator>(VI a, VI b) { return {_mm512_cmpgt_epi32_mask(a.v, b.v)}; }
inline float hsum(VF a) { return _mm512_reduce_add_ps(a.v); }
inline float hmax(VF a) { return _mm512_reduce_max_ps(a.v); }
inline void stream(float* p, VF a) { _mm512_stream_ps(p, a.v); }
// p * 2^n for integral n (one rounding, denormals and overflow included).
inline VF scale2(VF p, VF n) { return {_mm512_scalef_ps(p.v, n.v)}; }
#define KILN_VM_HAVE_SCALE2 1

#elif defined(__AVX2__) && defined(__FMA__)
inline constexpr int kW = 8;
struct VM {
  __m256 v;
};  // all-ones lanes
struct VI {
  __m256i v;
};
struct VF {
  using I = VI;
  using M = VM;
  static constexpr int W = 8;
  __m256 v;
};
inline __m256i tail_mask(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
inline VF set1(VF, float x) { return {_mm256_set1_ps(x)}; }
inline VF load(VF, const float* p) { return {_mm256_loadu_ps(p)}; }
inline VF load(VF, const float* p, int n) { return {_mm256_maskload_ps(p, tail_mask(n))}; }
inline void store(float* p, VF a) { _mm256_storeu_ps(p, a.v); }
inline void store(float* p, VF a, int n) { _mm256_maskstore_ps(p, tail_mask(n), a.v); }
inline VF operator+(VF a, VF b) { return {_mm256_add_ps(a.v, b.v)}; }
inline VF operator-(VF a, VF b) { return {_mm256_sub_ps(a.v, b.v)}; }
inline VF operator*(VF a, VF b) { return {_mm256_mul_ps(a.v, b.v)}; }
inline VF operator/(VF a, VF b) { return {_mm256_div_ps(a.v, b.v)}; }
inline VF operator-(VF a) { return {_mm256_xor_ps(a.v, _mm256_set1_ps(-0.0f))}; }
inline VF madd(VF a, VF b, VF c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
inline VF min(VF a, VF b) { return {_mm256_min_ps(a.v, b.v)}; }
inline VF max(VF a, VF b) { return {_mm256_max_ps(a.v, b.v)}; }
inline VF abs(VF a) { return {_mm256_andnot_ps(_mm256_set1_ps(-0.0f), a.v)}; }
inline VF sqrt(VF a) { return {_mm256_sqrt_ps(a.v)}; }
inline VF round_even(VF a) {
  return {_mm256_round_ps(a.v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)};
}
inline VM operator<(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LT_OQ)}; }
inline VM operator<=(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_LE_OQ)}; }
inline VM operator>(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_GT_OQ)}; }
inline VM operator>=(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_GE_OQ)}; }
inline VM operator==(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_EQ_OQ)}; }
inline VM operator!=(VF a, VF b) { return {_mm256_cmp_ps(a.v, b.v, _CMP_NEQ_UQ)}; }
inline VM isnan(VF a) { return {_mm256_cmp_ps(a.v, a.v, _CMP_UNORD_Q)}; }
inline VM operator&(VM a, VM b) { return {_mm256_and_ps(a.v, b.v)}; }
inline VM operator|(VM a, VM b) { return {_mm256_or_ps(a.v, b.v)}; }
inline VM operator~(VM a) {
  return {_mm256_xor_ps(a.v, _mm256_castsi256_ps(_mm256_set1_epi32(-1)))};
}
inline bool any(VM m) { return _mm256_movemask_ps(m.v) != 0; }
inline bool all(VM m) { return _mm256_movemask_ps(m.v) == 0xff; }
inline VF select(VM m, VF a, VF b) { return {_mm256_blendv_ps(b.v, a.v, m.v)}; }
inline VI select(VM m, VI a, VI b) {
  return {_mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(b.v), _mm256_castsi256_ps(a.v), m.v))};
}
inline VI as_int(VF a) { return {_mm256_castps_si256(a.v)}; }
inline VF as_float(VI a) { return {_mm256_castsi256_ps(a.v)}; }
inline VI to_int(VF a) { return {_mm256_cvtps_epi32(a.v)}; }
inline VF to_float(VI a) { return {_mm256_cvtepi32_ps(a.v)}; }
inline VI set1(VI, int32_t x) { return {_mm256_set1_epi32(x)}; }
inline VI operator+(VI a, VI b) { return {_mm256_add_epi32(a.v, b.v)}; }
inline VI operator-(VI a, VI b) { return {_mm256_sub_epi32(a.v, b.v)}; }
inline VI operator&(VI a, VI b) { return {_mm256_and_si256(a.v, b.v)}; }
inline VI operator|(VI a, VI b) { return {_mm256_or_si256(a.v, b.v)}; }
inline VI operator^(VI a, VI b) { return {_mm256_xor_si256(a.v, b.v)}; }
template <int S>
inline VI shl(VI a) {
  return {_mm256_slli_epi32(a.v, S)};
}
template <int S>
inline VI shr(VI a) {
  return {_mm256_srli_epi32(a.v, S)};
}
template <int S>
inline VI sra(VI a) {
  return {_mm256_srai_epi32(a.v, S)};
}
inline VM operator==(VI a, VI b) { return {_mm256_castsi256_ps(_mm256_cmpeq_epi32(a.v, b.v))}; }
inline VM operator>(VI a, VI b) { return {_mm256_castsi256_ps(_mm256_cmpgt_epi32(a.v, b.v))}; }
inline float hsum(VF a) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(VF a) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(a.v), _mm256_extractf128_ps(a.v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline void stream(float* p, VF a) { _mm256_stream_ps(p, a.v); }

#else
inline constexpr int kW = 1;
using VF = SF;
using VI = SI;
using VM = SM;
#endif

// Orders earlier stream() stores before later stores (call once after a loop).
inline void stream_fence() {
#if defined(__AVX512F__) || defined(__AVX2__)
  _mm_sfence();
#endif
}

template <class V>
concept Vec = std::is_same_v<V, SF> || std::is_same_v<V, VF>;

// Broadcast helpers: c<V>(1.5f) is a vector of 1.5f.
template <Vec V>
inline V c(float x) {
  return set1(V{}, x);
}
template <Vec V>
inline typename V::I ci(int32_t x) {
  return set1(typename V::I{}, x);
}
template <Vec V>
inline V loadv(const float* p) {
  return load(V{}, p);
}
template <Vec V>
inline V loadv(const float* p, int n) {
  return load(V{}, p, n);
}
template <Vec V>
inline V copysign(V mag, V sgn) {  // |mag| with sgn's sign bit
  return as_float(as_int(abs(mag)) | (as_int(sgn) & ci<V>(int32_t(0x80000000u))));
}

}  // namespace kiln::cpu::vm
