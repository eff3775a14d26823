// Small helpers the quantized-type row code shares: f16 scales in block bytes,
// and ggml's rounding helper.
#pragma once
#include <cstdint>
#include <cstring>

#include "kiln/dtype.h"

namespace kiln::quant {

inline void store_f16(uint8_t* p, float v) {
  const uint16_t h = f32_to_f16(v);
  std::memcpy(p, &h, 2);
}

inline float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// ggml's nearest_int: v + 1.5 * 2^23 puts round-to-nearest-even(v) in the low
// mantissa bits (|v| < 2^22). Kept as ggml computes it so ties round the same.
inline int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  int32_t bits;
  std::memcpy(&bits, &shifted, 4);
  return (bits & 0x007fffff) - 0x00400000;
}

}  // namespace kiln::quant
