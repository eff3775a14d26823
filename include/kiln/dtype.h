#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln {

enum class DType : uint8_t { f32, f16, bf16, i32 };
inline constexpr DType f32 = DType::f32;
inline constexpr DType f16 = DType::f16;
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType i32 = DType::i32;

size_t dtype_size(DType t);
const char* dtype_name(DType t);
inline bool is_floating(DType t) { return t != DType::i32; }

// Scalar conversions (round to nearest even; NaN stays NaN).
uint16_t f32_to_f16(float x);
float f16_to_f32(uint16_t h);
inline uint16_t f32_to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

}  // namespace kiln
