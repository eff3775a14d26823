// Bit packing the k-quants share.
#pragma once
#include <cstdint>

namespace kiln::quant {

inline constexpr int kSuperBlock = 256;  // values per k-quant block (ggml's QK_K)

// 2-bit fields of 256 values (Q2_K's quants, Q3_K's low bits): per 128 values,
// byte l holds values l, l + 32, l + 64, l + 96 at bits 0, 2, 4, 6.
inline void pack_2bit(const uint8_t* L, uint8_t* qs) {
  for (int j = 0; j < kSuperBlock; j += 128)
    for (int l = 0; l < 32; ++l)
      qs[j / 4 + l] =
          uint8_t(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}
inline int unpack_2bit(const uint8_t* qs, int v) {
  return (qs[v / 128 * 32 + v % 32] >> (2 * (v % 128 / 32))) & 3;
}

// The 6-bit scale and min of group j (of 8) in Q4_K/Q5_K's 12 scale bytes:
// groups 0-3 in the low 6 bits of bytes 0-3 (scales) and 4-7 (mins); groups
// 4-7 in the nibbles of bytes 8-11 with their top 2 bits in the top bits of
// bytes 0-3 (scales) and 4-7 (mins) (ggml's get_scale_min_k4).
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace kiln::quant
