// Host-side conversions of stored weights (f16/bf16 -> f32) shared by the
// Hugging Face and GGUF loaders.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

#include "kiln/dtype.h"

namespace kiln::models::detail {

// Little-endian f32, f16 or bf16 values -> f32.
inline std::vector<float> to_f32(const std::vector<uint8_t>& bytes, DType stored) {
  std::vector<float> out;
  if (stored == f32) {
    out.resize(bytes.size() / 4);
    std::memcpy(out.data(), bytes.data(), out.size() * 4);
    return out;
  }
  out.resize(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = stored == f16 ? f16_to_f32(h) : bf16_to_f32(h);
  }
  return out;
}

}  // namespace kiln::models::detail
