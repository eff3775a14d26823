// Q4_K and Q5_K: 256 values in 8 groups of 32, each with a 6-bit scale and a
// 6-bit min (k_quant_pack.h's scale_min_k4) in units of the f16 d and dmin;
// x = d * scale * q - dmin * min. ggml's reference formulas.
// Q4_K (144 bytes): f16 d, f16 dmin, scales[12], 4-bit quants[128] (per 64
// values, byte l holds value l in its low nibble and value l + 32 in its high).
// Q5_K (176 bytes): d, dmin, scales[12], qh[32] (bit 2 g / 2 g + 1 of byte l:
// the 5th bit of value 64 g + l / 64 g + 32 + l), then the low nibbles as Q4_K's.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/quant/k_quant_pack.h"
#include "core/quant/k_quant_search.h"
#include "core/quant/quant_rows.h"
#include "core/quant/quant_util.h"

namespace kiln::quant {
namespace {

constexpr int kGroup = 32, kGroups = kSuperBlock / kGroup;
constexpr size_t kQ4Bytes = 144, kQ5Bytes = 176;

// Fills d, dmin and the 12 scale bytes at y and L (quants in [0, nmax]) for
// one block; Q4_K (nmax 15) and Q5_K (nmax 31) differ only in the search's
// range parameters.
void quantize_scales_and_quants(const float* x, uint8_t* y, uint8_t* L, int nmax, float rmin,
                                int nstep) {
  uint8_t* sc = y + 4;
  uint8_t aux[kGroup];
  float weights[kGroup], mins[kGroups], scales[kGroups];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < kGroups; ++j) {
    const float* g = x + kGroup * j;
    // Weights |x| + rms(x): large values matter more, none counts for nothing.
    float sum_x2 = 0.0f;
    for (int l = 0; l < kGroup; ++l) sum_x2 += g[l] * g[l];
    const float av_x = std::sqrt(sum_x2 / 32.0f);
    for (int l = 0; l < kGroup; ++l) weights[l] = av_x + std::fabs(g[l]);
    scales[j] = search_scale_min(kGroup, nmax, g, weights, L + kGroup * j, &mins[j], aux, rmin,
                                 0.1f, nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }
  const float inv_scale = max_scale > 0.0f ? 63.0f / max_scale : 0.0f;
  const float inv_min = max_min > 0.0f ? 63.0f / max_min : 0.0f;
  std::memset(sc, 0, 12);
  for (int j = 0; j < kGroups; ++j) {
    const uint8_t ls = std::min<uint8_t>(63, uint8_t(nearest_int(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, uint8_t(nearest_int(inv_min * mins[j])));
    if (j < 4) {
      sc[j] = ls;
      sc[j + 4] = lm;
    } else {
      sc[j + 4] = uint8_t((ls & 0xF) | ((lm & 0xF) << 4));
      sc[j - 4] |= uint8_t((ls >> 4) << 6);
      sc[j] |= uint8_t((lm >> 4) << 6);
    }
  }
  store_f16(y, max_scale / 63.0f);
  store_f16(y + 2, max_min / 63.0f);
  // Requantize with the stored (rounded) scales and mins.
  const float d_all = load_f16(y), dmin_all = load_f16(y + 2);
  for (int j = 0; j < kGroups; ++j) {
    uint8_t s, m;
    scale_min_k4(j, sc, s, m);
    const float d = d_all * float(s);
    if (d == 0.0f) continue;
    const float dm = dmin_all * float(m);
    for (int i = 0; i < kGroup; ++i)
      L[kGroup * j + i] = uint8_t(std::clamp(nearest_int((x[kGroup * j + i] + dm) / d), 0, nmax));
  }
}

// Group j's scale and min, as the dequantizers use them.
void group_scale_min(const uint8_t* block, int j, float& d, float& m) {
  uint8_t s, mn;
  scale_min_k4(j, block + 4, s, mn);
  d = load_f16(block) * float(s);
  m = load_f16(block + 2) * float(mn);
}

// Value v's low nibble in the 128 bytes at qs.
int low_nibble(const uint8_t* qs, int v) {
  const uint8_t byte = qs[v / 64 * 32 + v % 32];
  return v % 64 < 32 ? byte & 0xF : byte >> 4;
}

}  // namespace

void quantize_row_q4_k(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kSuperBlock, y += kQ4Bytes) {
    uint8_t L[kSuperBlock];
    quantize_scales_and_quants(x, y, L, 15, -1.0f, 20);
    uint8_t* qs = y + 16;
    for (int j = 0; j < kSuperBlock; j += 64)
      for (int l = 0; l < 32; ++l) qs[j / 2 + l] = uint8_t(L[j + l] | (L[j + l + 32] << 4));
  }
}

void dequantize_row_q4_k(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kQ4Bytes, y += kSuperBlock)
    for (int j = 0; j < kGroups; ++j) {
      float d, m;
      group_scale_min(x, j, d, m);
      for (int v = kGroup * j; v < kGroup * (j + 1); ++v)
        y[v] = d * float(low_nibble(x + 16, v)) - m;
    }
}

void quantize_row_q5_k(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kSuperBlock, y += kQ5Bytes) {
    uint8_t L[kSuperBlock];
    quantize_scales_and_quants(x, y, L, 31, -0.5f, 15);
    uint8_t* qh = y + 16;
    uint8_t* qs = y + 48;
    std::memset(qh, 0, 32);
    for (int j = 0; j < kSuperBlock; j += 64)
      for (int l = 0; l < 32; ++l) {
        int lo = L[j + l], hi = L[j + l + 32];
        const int bit = j / 32;  // 2 g for the group pair g = j / 64
        if (lo > 15) {
          lo -= 16;
          qh[l] |= uint8_t(1 << bit);
        }
        if (hi > 15) {
          hi -= 16;
          qh[l] |= uint8_t(2 << bit);
        }
        qs[j / 2 + l] = uint8_t(lo | (hi << 4));
      }
  }
}

void dequantize_row_q5_k(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kQ5Bytes, y += kSuperBlock)
    for (int j = 0; j < kGroups; ++j) {
      float d, m;
      group_scale_min(x, j, d, m);
      for (int v = kGroup * j; v < kGroup * (j + 1); ++v) {
        const int high = (x[16 + v % 32] >> (v / 32)) & 1;
        y[v] = d * float(low_nibble(x + 48, v) + (high ? 16 : 0)) - m;
      }
    }
}

}  // namespace kiln::quant
