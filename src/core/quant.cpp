// GGUF's Q8_0 and Q4_0 blocks: quantize and dequantize rows, with ggml's
// reference formulas (the ones llama.cpp's quantize tool writes model files
// with), so a kiln-quantized tensor is byte for byte what llama.cpp would write.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kiln/dtype.h"
#include "kiln/error.h"

namespace kiln {
namespace {

constexpr int kBlock = 32;

void store_f16(uint8_t* p, float d) {
  const uint16_t h = f32_to_f16(d);
  std::memcpy(p, &h, 2);
}

float load_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

void quantize_block_q8_0(const float* x, uint8_t* y) {
  float amax = 0.0f;
  for (int j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(y, d);
  for (int j = 0; j < kBlock; ++j) y[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
}

void quantize_block_q4_0(const float* x, uint8_t* y) {
  // The value of largest magnitude (its sign kept; the first one on a tie)
  // maps to -8, so the block uses the full range [-8, 7] on its side.
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kBlock; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  store_f16(y, d);
  for (int j = 0; j < kBlock / 2; ++j) {
    // x * id + 8.5 lies in [0.5, 16.5]: truncation rounds x / d + 8 to nearest.
    const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
    const int hi = std::min(15, int(int8_t(x[j + kBlock / 2] * id + 8.5f)));
    y[2 + j] = uint8_t(lo | (hi << 4));
  }
}

void check_row(const char* what, DType t, int64_t n) {
  if (!is_quantized(t)) fail(what, "dtype must be q8_0 or q4_0, got ", dtype_name(t));
  if (n < 0 || n % kBlock != 0)
    fail(what, dtype_name(t), " rows hold whole blocks of 32 values; got ", n, " values");
}

}  // namespace

void quantize_row(DType t, const float* x, void* y, int64_t n) {
  check_row("quantize", t, n);
  auto* out = static_cast<uint8_t*>(y);
  const size_t bs = dtype_size(t);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    if (t == DType::q8_0) quantize_block_q8_0(x + b * kBlock, out + size_t(b) * bs);
    else quantize_block_q4_0(x + b * kBlock, out + size_t(b) * bs);
  }
}

void dequantize_row(DType t, const void* x, float* y, int64_t n) {
  check_row("dequantize", t, n);
  const auto* in = static_cast<const uint8_t*>(x);
  const size_t bs = dtype_size(t);
  for (int64_t b = 0; b < n / kBlock; ++b) {
    const uint8_t* blk = in + size_t(b) * bs;
    const float d = load_f16(blk);
    float* o = y + b * kBlock;
    if (t == DType::q8_0) {
      for (int j = 0; j < kBlock; ++j) o[j] = float(int8_t(blk[2 + j])) * d;
    } else {  // low nibbles are values 0..15, high nibbles 16..31
      for (int j = 0; j < kBlock / 2; ++j) {
        o[j] = float(int(blk[2 + j] & 0x0F) - 8) * d;
        o[j + kBlock / 2] = float(int(blk[2 + j] >> 4) - 8) * d;
      }
    }
  }
}

}  // namespace kiln
