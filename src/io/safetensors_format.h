// Facts of the safetensors format shared by its reader and writer: the dtype
// names of the spec and their sizes in bits (F4 and F6 pack several elements
// per byte), and which of them kiln tensors can hold.
#pragma once
#include <bit>
#include <cstdint>
#include <optional>
#include <string_view>

#include "kiln/dtype.h"

namespace kiln::safetensors {

static_assert(std::endian::native == std::endian::little,
              "kiln's safetensors reader/writer assume a little-endian host");

inline constexpr const char* kMetadataKey = "__metadata__";

struct DTypeInfo {
  std::string_view name;
  uint32_t bits;
  std::optional<DType> kiln;  // the kiln dtype with the same bytes, if any
};

inline constexpr DTypeInfo kDTypes[] = {
    {"BOOL", 8, std::nullopt},    {"U8", 8, std::nullopt},      {"I8", 8, std::nullopt},
    {"F8_E5M2", 8, std::nullopt}, {"F8_E4M3", 8, std::nullopt}, {"F8_E8M0", 8, std::nullopt},
    {"F4", 4, std::nullopt},      {"F6_E2M3", 6, std::nullopt}, {"F6_E3M2", 6, std::nullopt},
    {"I16", 16, std::nullopt},    {"U16", 16, std::nullopt},    {"F16", 16, DType::f16},
    {"BF16", 16, DType::bf16},    {"I32", 32, DType::i32},      {"U32", 32, std::nullopt},
    {"F32", 32, DType::f32},      {"F64", 64, std::nullopt},    {"I64", 64, std::nullopt},
    {"U64", 64, std::nullopt},    {"C64", 64, std::nullopt},
};

inline const DTypeInfo* find_dtype(std::string_view name) {
  for (const DTypeInfo& d : kDTypes)
    if (d.name == name) return &d;
  return nullptr;
}

inline std::string_view name_of(DType t) {
  switch (t) {
    case DType::f32: return "F32";
    case DType::f16: return "F16";
    case DType::bf16: return "BF16";
    case DType::i32: return "I32";
    default: break;  // quantized: the writer refuses them, safetensors has no block formats
  }
  return "F32";
}

}  // namespace kiln::safetensors
