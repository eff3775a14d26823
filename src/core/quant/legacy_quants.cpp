// GGUF's 32-value block formats: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, with ggml's
// reference formulas (the ones llama.cpp's quantize tool writes model files
// with), so a kiln-quantized tensor is byte for byte what llama.cpp writes.
// Layouts (bytes): Q8_0 d(2) q(32 int8). Q4_0 d(2) nibbles(16). Q4_1 d(2) m(2)
// nibbles(16). Q5_0 d(2) qh(4) nibbles(16). Q5_1 d(2) m(2) qh(4) nibbles(16).
// Byte j of the nibbles holds value j (low) and value j + 16 (high); bit j of
// the little-endian u32 qh is the 5th bit of value j.
#include <algorithm>
#include <cfloat>
#include <cmath>

#include "core/quant/quant_rows.h"
#include "core/quant/quant_util.h"

namespace kiln::quant {
namespace {

constexpr int kBlock = 32;
constexpr int kHalf = kBlock / 2;

// The value of largest magnitude, its sign kept (the first one on a tie).
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < kBlock; ++j)
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  return max;
}

void min_max(const float* x, float& lo, float& hi) {
  lo = FLT_MAX;
  hi = -FLT_MAX;
  for (int j = 0; j < kBlock; ++j) {
    if (x[j] < lo) lo = x[j];
    if (x[j] > hi) hi = x[j];
  }
}

void store_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
uint32_t load_u32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 32 5-bit values q: the low nibbles to qs, the 5th bits to the u32 at qh.
void pack5(const uint8_t* q, uint8_t* qh, uint8_t* qs) {
  uint32_t h = 0;
  for (int j = 0; j < kHalf; ++j) {
    qs[j] = uint8_t((q[j] & 15) | ((q[j + kHalf] & 15) << 4));
    h |= uint32_t(q[j] >> 4 & 1) << j;
    h |= uint32_t(q[j + kHalf] >> 4 & 1) << (j + kHalf);
  }
  store_u32(qh, h);
}

void unpack5(const uint8_t* qh, const uint8_t* qs, int* q) {
  const uint32_t h = load_u32(qh);
  for (int j = 0; j < kHalf; ++j) {
    q[j] = (qs[j] & 15) | int(h >> j & 1) << 4;
    q[j + kHalf] = (qs[j] >> 4) | int(h >> (j + kHalf) & 1) << 4;
  }
}

}  // namespace

void quantize_row_q8_0(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBlock, y += 34) {
    float amax = 0.0f;
    for (int j = 0; j < kBlock; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(y, d);
    for (int j = 0; j < kBlock; ++j) y[2 + j] = uint8_t(int8_t(std::round(x[j] * id)));
  }
}

void dequantize_row_q8_0(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += 34, y += kBlock) {
    const float d = load_f16(x);
    for (int j = 0; j < kBlock; ++j) y[j] = float(int8_t(x[2 + j])) * d;
  }
}

void quantize_row_q4_0(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBlock, y += 18) {
    // The value of largest magnitude maps to -8, so the block uses the full
    // range [-8, 7] on its side.
    const float d = signed_absmax(x) / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(y, d);
    for (int j = 0; j < kHalf; ++j) {
      // x * id + 8.5 lies in [0.5, 16.5]: truncation rounds x / d + 8 to nearest.
      const int lo = std::min(15, int(int8_t(x[j] * id + 8.5f)));
      const int hi = std::min(15, int(int8_t(x[j + kHalf] * id + 8.5f)));
      y[2 + j] = uint8_t(lo | (hi << 4));
    }
  }
}

void dequantize_row_q4_0(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += 18, y += kBlock) {
    const float d = load_f16(x);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = float(int(x[2 + j] & 0x0F) - 8) * d;
      y[j + kHalf] = float(int(x[2 + j] >> 4) - 8) * d;
    }
  }
}

void quantize_row_q4_1(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBlock, y += 20) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = (hi - lo) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(y, d);
    store_f16(y + 2, lo);
    for (int j = 0; j < kHalf; ++j) {
      // (x - min) / d + 0.5 truncated: rounds to nearest (the f32 d and min).
      const int q0 = std::min(15, int(int8_t((x[j] - lo) * id + 0.5f)));
      const int q1 = std::min(15, int(int8_t((x[j + kHalf] - lo) * id + 0.5f)));
      y[4 + j] = uint8_t(q0 | (q1 << 4));
    }
  }
}

void dequantize_row_q4_1(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += 20, y += kBlock) {
    const float d = load_f16(x), m = load_f16(x + 2);
    for (int j = 0; j < kHalf; ++j) {
      y[j] = float(x[4 + j] & 0x0F) * d + m;
      y[j + kHalf] = float(x[4 + j] >> 4) * d + m;
    }
  }
}

void quantize_row_q5_0(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBlock, y += 22) {
    const float d = signed_absmax(x) / -16.0f;  // the largest magnitude maps to -16
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(y, d);
    uint8_t q[kBlock];
    for (int j = 0; j < kBlock; ++j) q[j] = uint8_t(std::min(31, int(int8_t(x[j] * id + 16.5f))));
    pack5(q, y + 2, y + 6);
  }
}

void dequantize_row_q5_0(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += 22, y += kBlock) {
    const float d = load_f16(x);
    int q[kBlock];
    unpack5(x + 2, x + 6, q);
    for (int j = 0; j < kBlock; ++j) y[j] = float(q[j] - 16) * d;
  }
}

void quantize_row_q5_1(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBlock, y += 24) {
    float lo, hi;
    min_max(x, lo, hi);
    const float d = (hi - lo) / 31.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(y, d);
    store_f16(y + 2, lo);
    // No clamp to 31 here (ggml has none): (x - min) / d + 0.5 stays below 32.
    uint8_t q[kBlock];
    for (int j = 0; j < kBlock; ++j) q[j] = uint8_t((x[j] - lo) * id + 0.5f);
    pack5(q, y + 4, y + 8);
  }
}

void dequantize_row_q5_1(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += 24, y += kBlock) {
    const float d = load_f16(x), m = load_f16(x + 2);
    int q[kBlock];
    unpack5(x + 4, x + 8, q);
    for (int j = 0; j < kBlock; ++j) y[j] = float(q[j]) * d + m;
  }
}

}  // namespace kiln::quant
