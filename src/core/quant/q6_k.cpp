// Q6_K (210 bytes): 256 values in 16 groups of 16 with signed 8-bit scales in
// units of an f16 d; x = d * scale * (q - 32), q 6 bits. ggml's reference
// formulas. Layout: ql[128] low nibbles (per 128 values, byte l holds values
// l / l + 64 and byte l + 32 holds values l + 32 / l + 96, low / high nibble),
// qh[64] top 2 bits (per 128 values, byte l holds values l, l + 32, l + 64,
// l + 96 at bits 0, 2, 4, 6), int8 scales[16], f16 d.
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
constexpr size_t kBytes = 210;

void quantize_block(const float* x, uint8_t* y) {
  uint8_t* ql = y;
  uint8_t* qh = y + 128;
  auto* scales = reinterpret_cast<int8_t*>(y + 192);
  int8_t L[kSuperBlock];
  float group_scales[kGroups];
  float max_scale = 0.0f, max_abs_scale = 0.0f;  // the scale of largest magnitude, sign kept
  for (int j = 0; j < kGroups; ++j) {
    group_scales[j] = search_symmetric(kGroup, 32, x + kGroup * j, L + kGroup * j);
    const float a = std::fabs(group_scales[j]);
    if (a > max_abs_scale) {
      max_abs_scale = a;
      max_scale = group_scales[j];
    }
  }
  if (max_abs_scale < kGroupMaxEps) {  // all zero
    std::memset(y, 0, kBytes);
    return;
  }
  const float iscale = -128.0f / max_scale;
  store_f16(y + 208, 1.0f / iscale);
  for (int j = 0; j < kGroups; ++j)
    scales[j] = int8_t(std::min(127, nearest_int(iscale * group_scales[j])));
  // Requantize with the stored (rounded) scales.
  const float d_all = load_f16(y + 208);
  for (int j = 0; j < kGroups; ++j) {
    const float d = d_all * float(scales[j]);
    if (d == 0.0f) continue;
    for (int i = 0; i < kGroup; ++i)
      L[kGroup * j + i] = int8_t(std::clamp(nearest_int(x[kGroup * j + i] / d), -32, 31) + 32);
  }
  for (int j = 0; j < kSuperBlock; j += 128, ql += 64, qh += 32)
    for (int l = 0; l < 32; ++l) {
      const int q0 = L[j + l], q1 = L[j + l + 32], q2 = L[j + l + 64], q3 = L[j + l + 96];
      ql[l] = uint8_t((q0 & 0xF) | ((q2 & 0xF) << 4));
      ql[l + 32] = uint8_t((q1 & 0xF) | ((q3 & 0xF) << 4));
      qh[l] = uint8_t((q0 >> 4) | ((q1 >> 4) << 2) | ((q2 >> 4) << 4) | ((q3 >> 4) << 6));
    }
}

}  // namespace

void quantize_row_q6_k(const float* x, uint8_t* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b) quantize_block(x + b * kSuperBlock, y + b * kBytes);
}

void dequantize_row_q6_k(const uint8_t* x, float* y, int64_t nblocks) {
  for (int64_t b = 0; b < nblocks; ++b, x += kBytes, y += kSuperBlock) {
    const float d = load_f16(x + 208);
    const auto* scales = reinterpret_cast<const int8_t*>(x + 192);
    for (int v = 0; v < kSuperBlock; ++v) {
      const int half = v / 128, quarter = v % 128 / 32,
                l = v % 32;  // value = 128 half + 32 quarter + l
      const uint8_t low = x[64 * half + 32 * (quarter & 1) + l];
      const int lo4 = quarter < 2 ? low & 0xF : low >> 4;
      const int hi2 = (x[128 + 32 * half + l] >> (2 * quarter)) & 3;
      y[v] = d * float(scales[v / kGroup]) * float((lo4 | (hi2 << 4)) - 32);
    }
  }
}

}  // namespace kiln::quant
