// Scalar f16 / bf16 -> f32 conversions for the GEMM packing routines (the SIMD
// ones live next to the packing code of each instruction set).
#pragma once
#include <cstdint>
#include <cstring>

#include "backends/cpu/gemm.h"

#if defined(__F16C__)
#include "backends/cpu/intrinsics.h"
#endif

namespace kiln::cpu::gemm_detail {

inline float bits_to_f32(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE binary16 -> binary32 (exact; subnormals, infinities and NaNs included).
inline float f16_bits_to_f32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));  // inf / NaN
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  const float mag = float(mant) * 5.9604644775390625e-8f;  // subnormal or zero: mant * 2^-24
  return sign ? -mag : mag;
#endif
}

// The f16 stored at p (a quantized block's scale; blocks are byte-aligned).
inline float f16_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_bits_to_f32(h);
}

inline float bf16_bits_to_f32(uint16_t h) { return bits_to_f32(uint32_t(h) << 16); }

// f32 -> bf16 as vcvtneps2bf16 rounds (what the GEMM's round_bf16 operands
// use on every path): nearest even, NaN quiet, subnormal inputs as signed zero.
inline uint16_t f32_to_bf16_daz(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) == 0) return uint16_t((u >> 16) & 0x8000u);        // zero or subnormal
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

// Element idx of an array of type t, as f32.
inline float load_as_f32(const void* data, GemmType t, int64_t idx) {
  if (t == GemmType::f32) return static_cast<const float*>(data)[idx];
  const uint16_t h = static_cast<const uint16_t*>(data)[idx];
  return t == GemmType::f16 ? f16_bits_to_f32(h) : bf16_bits_to_f32(h);
}

}  // namespace kiln::cpu::gemm_detail
