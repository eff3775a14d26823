#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln {

// The block-quantized dtypes are GGUF's formats, one per row of
// kiln/quant_types.def (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k .. q6_k), laid out
// bit for bit as ggml lays them out: the last dim is split into blocks of
// dtype_block_elems values (32, or 256 for the k-quants), each stored in
// dtype_size bytes (scales and quants; see the .def and src/core/quant/). A
// quantized tensor's last dim is a multiple of its block and its rows are
// contiguous; its stride along the last dim is one block's bytes (ggml's nb[0]).
enum class DType : uint8_t {
  f32,
  f16,
  bf16,
  i32,
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) name,
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
};
inline constexpr DType f32 = DType::f32;
inline constexpr DType f16 = DType::f16;
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType i32 = DType::i32;
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  inline constexpr DType name = DType::name;
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE

// The .def's matmul column as a bool: whether the CPU matmul reads the type as stored.
#define KILN_QUANT_MATMUL_qmatmul true
#define KILN_QUANT_MATMUL_dequant false

// One row of kiln/quant_types.def.
struct QuantType {
  DType dtype;
  const char* name;       // "q4_k"
  const char* gguf_name;  // "Q4_K"
  uint32_t gguf_id;       // ggml's type number
  int64_t block_elems;    // values per block
  size_t block_bytes;     // bytes per block
  bool matmul_reads;      // the CPU matmul reads it as stored
};
inline constexpr QuantType kQuantTypes[] = {
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  {DType::name, #name, GGUF_NAME, gguf_id, block_elems, block_bytes, KILN_QUANT_MATMUL_##matmul},
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
};
inline constexpr DType kFirstQuantDType = kQuantTypes[0].dtype;

inline constexpr bool is_quantized(DType t) { return uint8_t(t) >= uint8_t(kFirstQuantDType); }
inline constexpr bool is_floating(DType t) { return t != DType::i32; }
// The table row of a quantized dtype (t must be quantized).
inline constexpr const QuantType& quant_type(DType t) {
  return kQuantTypes[uint8_t(t) - uint8_t(kFirstQuantDType)];
}
// The row whose GGUF type number is id, or nullptr.
inline constexpr const QuantType* quant_type_of_gguf(uint32_t id) {
  for (const QuantType& q : kQuantTypes)
    if (q.gguf_id == id) return &q;
  return nullptr;
}

// Bytes of one element, or of one block for a quantized dtype (ggml's type size).
size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Values per block of a quantized dtype, 1 for the others.
inline constexpr int64_t dtype_block_elems(DType t) {
  return is_quantized(t) ? quant_type(t).block_elems : 1;
}
// Bytes of n consecutive values along the last dim (n a multiple of the block).
inline size_t dtype_row_bytes(DType t, int64_t n) {
  return size_t(n / dtype_block_elems(t)) * dtype_size(t);
}

// ggml's reference quantizers (quantize_row_<type>_ref, no importance matrix),
// byte for byte: n values (n a multiple of t's block) from x into blocks at y.
// The formulas are in src/core/quant/<family>.cpp. Q8_0: d = max|x| / 127,
// q = round(x / d) (half away from zero). Q4_0: m is the value of largest
// magnitude, d = m / -8, q = min(15, trunc(x / d + 8.5)). Scales are stored as
// f16; the quants are computed with the f32 scales unless the format's
// formula says otherwise (the k-quants requantize with the stored scales).
void quantize_row(DType t, const float* x, void* y, int64_t n);
// The values of n quantized values at x (ggml's dequantize_row_<type>, bit for bit).
void dequantize_row(DType t, const void* x, float* y, int64_t n);

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
