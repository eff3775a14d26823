#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace kiln {

// q8_0 and q4_0 are GGUF's block-quantized formats, laid out bit for bit as
// ggml lays them out: the last dim is split into blocks of 32 values, each an
// f16 scale d followed by the quants (q8_0: 32 int8, value = d * q; q4_0: 16
// bytes, byte i holding value i in its low nibble and value i + 16 in its high
// nibble, value = d * (nibble - 8)). A quantized tensor's last dim is a
// multiple of 32 and its rows are contiguous; its stride along the last dim is
// one block's bytes (ggml's nb[0]).
enum class DType : uint8_t { f32, f16, bf16, i32, q8_0, q4_0 };
inline constexpr DType f32 = DType::f32;
inline constexpr DType f16 = DType::f16;
inline constexpr DType bf16 = DType::bf16;
inline constexpr DType i32 = DType::i32;
inline constexpr DType q8_0 = DType::q8_0;
inline constexpr DType q4_0 = DType::q4_0;

// Bytes of one element, or of one block for a quantized dtype (ggml's type size).
size_t dtype_size(DType t);
const char* dtype_name(DType t);
inline bool is_quantized(DType t) { return t == DType::q8_0 || t == DType::q4_0; }
inline bool is_floating(DType t) { return t != DType::i32; }
// Values per block: 32 for the quantized dtypes, 1 for the others.
inline int64_t dtype_block_elems(DType t) { return is_quantized(t) ? 32 : 1; }
// Bytes of n consecutive values along the last dim (n a multiple of the block).
inline size_t dtype_row_bytes(DType t, int64_t n) {
  return size_t(n / dtype_block_elems(t)) * dtype_size(t);
}

// ggml's reference quantizers (quantize_row_q8_0_ref, quantize_row_q4_0_ref),
// bit for bit: n values (n % 32 == 0) from x into n / 32 blocks at y.
// Q8_0: d = max|x| / 127, q = round(x / d) (half away from zero). Q4_0: m is
// the value of largest magnitude, d = m / -8, q = min(15, trunc(x / d + 8.5)).
// d is stored as f16; the quants are computed with the f32 d.
void quantize_row(DType t, const float* x, void* y, int64_t n);
// y[i] = d * q for n values (n % 32 == 0) of blocks x.
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
