// Facts of the GGUF v3 layout shared by the reader and the writer (see ggml's
// docs/gguf.md): little-endian; header = magic "GGUF", u32 version, u64 tensor
// count, u64 metadata count; metadata = (string key, u32 type, value)*; tensor
// infos = (string name, u32 n_dims, u64 dims[n_dims] innermost first, u32 ggml
// type, u64 offset relative to the data section)*; then zero padding to
// `general.alignment` (u32, default 32) and the data section, each tensor at an
// aligned offset. A string is a u64 byte length followed by the bytes (no NUL);
// an array is u32 element type, u64 count, then the elements.
#pragma once
#include <bit>
#include <cstdint>
#include <optional>
#include <string>

#include "kiln/io.h"

namespace kiln::gguf {

static_assert(std::endian::native == std::endian::little,
              "kiln's GGUF reader/writer assume a little-endian host");

inline constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
inline constexpr uint32_t kVersion = 3;
inline constexpr uint32_t kDefaultAlignment = 32;
inline constexpr const char* kAlignmentKey = "general.alignment";
inline constexpr uint64_t kMaxKeyLength = 65535;     // spec: keys are < 2^16 bytes
inline constexpr uint64_t kMaxNameLength = 64;       // spec: tensor names <= 64 bytes
inline constexpr uint64_t kMaxWriteNameLength = 63;  // ggml needs room for a NUL
inline constexpr int kMaxArrayDepth = 4;  // nested arrays (a corrupt file could nest deeply)
// Alignments above 64 KiB serve no purpose and let a tiny file demand huge
// padding when it is re-saved (2^30 would write 1 GiB).
inline constexpr uint32_t kMaxAlignment = 1u << 16;

// ggml tensor type numbers of the dtypes kiln stores.
inline constexpr uint32_t kGgmlF32 = 0;
inline constexpr uint32_t kGgmlF16 = 1;
inline constexpr uint32_t kGgmlI32 = 26;
inline constexpr uint32_t kGgmlBF16 = 30;

// The block-quantized types (their ggml numbers among them) are the rows of
// kiln/quant_types.def.

inline uint32_t ggml_type_of(DType t) {
  if (is_quantized(t)) return quant_type(t).gguf_id;
  switch (t) {
    case DType::f32: return kGgmlF32;
    case DType::f16: return kGgmlF16;
    case DType::bf16: return kGgmlBF16;
    case DType::i32: return kGgmlI32;
    default: return kGgmlF32;
  }
}

// The dtype of ggml type number t (plain or block-quantized), or nullopt.
inline std::optional<DType> dtype_of_ggml(uint32_t t) {
  switch (t) {
    case kGgmlF32: return DType::f32;
    case kGgmlF16: return DType::f16;
    case kGgmlBF16: return DType::bf16;
    case kGgmlI32: return DType::i32;
    default: break;
  }
  if (const QuantType* q = quant_type_of_gguf(t)) return q->dtype;
  return std::nullopt;
}

// "f32=0, f16=1, Q4_0=2, ..." for errors about type numbers kiln does not read.
std::string known_ggml_types();

inline bool valid_type(uint32_t t) { return t <= uint32_t(GgufType::f64); }

// Bytes of one element of a fixed-size type; 0 for string and array.
inline uint64_t fixed_size(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean: return 1;
    case GgufType::u16:
    case GgufType::i16: return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32: return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64: return 8;
    default: return 0;
  }
}

// The fewest bytes one element of type t can take in a file: bounds counts
// before anything is allocated.
inline uint64_t min_size(GgufType t) {
  if (t == GgufType::string) return 8;  // length
  if (t == GgufType::array) return 12;  // element type + count
  return fixed_size(t);
}

inline bool is_integer(GgufType t) {
  switch (t) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64: return true;
    default: return false;
  }
}

inline bool is_power_of_two(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

inline uint64_t align_up(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace kiln::gguf

namespace kiln {
// Lets the reader fill a GgufValue's private fields directly.
struct GgufValueAccess {
  static GgufValue make(GgufType type, GgufType elem, size_t count, std::vector<uint8_t> raw,
                        std::vector<std::string> strings, std::vector<GgufValue> arrays) {
    GgufValue v;
    v.type_ = type;
    v.elem_ = elem;
    v.count_ = count;
    v.raw_ = std::move(raw);
    v.strings_ = std::move(strings);
    v.arrays_ = std::move(arrays);
    return v;
  }
  static void set_where(GgufValue& v, std::string where) { v.where_ = std::move(where); }
  static const std::vector<std::string>& strings(const GgufValue& v) { return v.strings_; }
  static const std::vector<GgufValue>& arrays(const GgufValue& v) { return v.arrays_; }
};
}  // namespace kiln
