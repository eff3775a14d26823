// Q2_K and Q3_K: 256 values in 16 groups of 16, ggml's reference formulas.
// Q2_K (84 bytes): scales[16] (low nibble: the group's scale, high: its min,
// both in units of the f16 d / dmin), 2-bit quants[64] (k_quant_pack.h), f16 d,
// f16 dmin; x = d * scale * q - dmin * min.
// Q3_K (110 bytes): hmask[32] (bit b of byte l: the high bit of value 32 b + l),
// 2-bit low quants[64], 12 bytes of 6-bit signed scales (low nibbles of groups
// 0-7 then 8-15 in bytes 0-7, top 2 bits in bytes 8-11), f16 d;
// x = d * (scale - 32) * (q - 4).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/k_quant_pack.h"
#include "core/quant/k_quant_search.h"
#include "core/quant/quant_rows.h"
#include "core/quant/quant_util.h"

namespace kiln::quant {
namespace {

constexpr int kGroup = 16, kGroups = kSuperBlock / kGroup;
constexpr size_t kQ2Bytes = 84, kQ3Bytes = 110;

// Q3_K's signed 6-bit scale of group j, offset by 32 (0..63).
int q3_scale(const uint8_t* sc, int j) {
  const int lo = j < 8 ? sc[j] & 0xF : sc[j - 8] >> 4;
  return lo | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

void quantize_block_q2_k(const float* x, uint8_t* y) {
  uint8_t* scales = y;
  uint8_t* qs = y + 16;
  uint8_t L[kSuperBlock], aux[kGroup];
  float weights[kGroup], mins[kGroups], group_scales[kGroups];
  float max_scale = 0.0f, max_min = 0.0f;  // the min is subtracted: scales are >= 0
  for (int j = 0; j < kGroups; ++j) {
    for (int l = 0; l < kGroup; ++l) weights[l] = std::fabs(x[kGroup * j + l]);
    group_scales[j] = search_scale_min(kGroup, 3, x + kGroup * j, weights, L + kGroup * j, &mins[j],
                                       aux, -0.5f, 0.1f, 15, true);
    max_scale = std::max(max_scale, group_scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  std::memset(scales, 0, kGroups);
  store_f16(y + 80, 0.0f);
  store_f16(y + 82, 0.0f);
  if (max_scale > 0.0f) {
    const float iscale = 15.0f / max_scale;
    for (int j = 0; j < kGroups; ++j) scales[j] = uint8_t(nearest_int(iscale * group_scales[j]));
    store_f16(y + 80, max_scale / 15.0f);
  }
  if (max_min > 0.0f) {
    const float iscale = 15.0f / max_min;
    for (int j = 0; j < kGroups; ++j) scales[j] |= uint8_t(nearest_int(iscale * mins[j]) << 4);
    store_f16(y + 82, max_min / 15.0f);
  }
  // Requantize with the stored (rounded) scales and mins.
  const float d_all = load_f16(y + 80), dmin_all = load_f16(y + 82);
  for (int j = 0; j < kGroups; ++j) {
    const float d = d_all * float(scales[j] & 0xF);
    if (d == 0.0f) continue;
    const float dm = dmin_all * float(scales[j] >> 4);
    for (int i = 0; i < kGroup; ++i)
      L[kGroup * j + i] = uint8_t(std::clamp(nearest_int((x[kGroup * j + i] + dm) / d), 0, 3));
  }
  pack_2bit(L, qs);
}

void quantize_block_q3_k(const float* x, uint8_t* y) {
  uint8_t* hmask = y;
  uint8_t* qs = y + 32;
  uint8_t* sc = y + 96;
  int8_t L[kSuperBlock];
  float group_scales[kGroups];
  float max_scale = 0.0f, amax = 0.0f;  // the scale of largest magnitude, sign kept
  for (int j = 0; j < kGroups; ++j) {
    group_scales[j] = search_symmetric_q3(kGroup, 4, x + kGroup * j, L + kGroup * j);
    const float a = std::fabs(group_scales[j]);
    if (a > amax) {
      amax = a;
      max_scale = group_scales[j];
    }
  }
  std::memset(sc, 0, 12);
  if (max_scale != 0.0f) {
    const float iscale = -32.0f / max_scale;
    for (int j = 0; j < kGroups; ++j) {
      const int l = std::clamp(int(int8_t(nearest_int(iscale * group_scales[j]))), -32, 31) + 32;
      if (j < 8) sc[j] = uint8_t(l & 0xF);
      else sc[j - 8] |= uint8_t((l & 0xF) << 4);
      sc[j % 4 + 8] |= uint8_t((l >> 4) << (2 * (j / 4)));
    }
    store_f16(y + 108, 1.0f / iscale);
  } else {
    store_f16(y + 108, 0.0f);
  }
  const float d_all = load_f16(y + 108);
  for (int j = 0; j < kGroups; ++j) {
    const float d = d_all * float(q3_scale(sc, j) - 32);
    if (d == 0.0f) continue;
    for (int i = 0; i < kGroup; ++i)
      L[kGroup * j + i] = int8_t(std::clamp(nearest_int(x[kGroup * j + i] / d), -4, 3) + 4);
  }
  // Split each 3-bit quant: the high bit to hmask, the low two to qs.
  std::memset(hmask, 0, 32);
  uint8_t low[kSuperBlock];
  for (int v = 0; v < kSuperBlock; ++v) {
    int q = L[v];
    if (q > 3) {
      hmask[v % 32] |= uint8_t(1 << (v / 32));
      q -= 4;
    }
    low[v] = uint8_t(q);
  }
  pack_2bit(low, qs);
}

}  // namespace

void quantize_row_q2_k(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) quantize_block_q2_k(x + b * kSuperBlock, y + b * kQ2Bytes);
}

void dequantize_row_q2_k(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kQ2Bytes, y += kSuperBlock) {
    const float d = load_f16(x + 80), dmin = load_f16(x + 82);
    for (int j = 0; j < kGroups; ++j) {
      const float dl = d * float(x[j] & 0xF), ml = dmin * float(x[j] >> 4);
      for (int v = kGroup * j; v < kGroup * (j + 1); ++v)
        y[v] = dl * float(unpack_2bit(x + 16, v)) - ml;
    }
  }
}

void quantize_row_q3_k(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) quantize_block_q3_k(x + b * kSuperBlock, y + b * kQ3Bytes);
}

void dequantize_row_q3_k(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kQ3Bytes, y += kSuperBlock) {
    const float d = load_f16(x + 108);
    for (int j = 0; j < kGroups; ++j) {
      const float dl = d * float(q3_scale(x + 96, j) - 32);
      for (int v = kGroup * j; v < kGroup * (j + 1); ++v) {
        const int high = (x[v % 32] >> (v / 32)) & 1;
        y[v] = dl * float(unpack_2bit(x + 32, v) - (high ? 0 : 4));
      }
    }
  }
}

}  // namespace kiln::quant
