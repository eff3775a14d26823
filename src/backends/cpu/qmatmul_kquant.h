// The row-dot (decode) path of x @ W^T for the k-quants (Q2_K..Q6_K): each row
// of x is rounded once to 8-bit blocks of 256 values (BlockQ8K, one f32 scale
// per block and the sums of each 16 quants, as ggml's Q8_K), then every block
// of W is multiplied with its x block in integers (exact) and the block's
// integer sums are scaled into one f32 sum per row, block after block:
//   y += (dx * d) * isum - (dx * dmin) * msum     (Q2_K, Q4_K, Q5_K)
//   y += (dx * d) * isum                          (Q3_K, Q6_K)
// isum = sum over groups of scale_g * sum(q x) with q the signed quant (Q3_K's
// -4 and Q6_K's -32 offsets applied when unpacking, or for Q6_K on AVX2
// through the 16-sums), msum = sum over groups of min_g * (sum of the group's
// x quants). Both paths (portable, AVX2) compute the same integers and the
// same f32 operations in the same order, so they differ at most by where the
// compiler fuses a multiply-add.
//
// Error: x's rounding moves each value by at most half its block's step
// dx = max |x of the block| / 127, so |y - W x| <= sum_c |W[j, c]| dx(c) / 2 +
// f32 rounding (qmatmul.h). Non-finite x makes dx NaN: the outputs are NaN.
#pragma once
#include <cstdint>

#include "kiln/dtype.h"

namespace kiln::cpu::qmatmul_detail {

inline constexpr int kQK = 256;  // values per k-quant block (ggml's QK_K)

struct BlockQ8K {
  float d;            // x = d * qs
  int8_t qs[kQK];     // in [-127, 127]
  int16_t bsums[16];  // sums of qs[16 g .. 16 g + 15]
};

// Whether f is one of the k-quants this path reads.
constexpr bool is_k_quant(DType f) {
  return f == DType::q2_k || f == DType::q3_k || f == DType::q4_k || f == DType::q5_k ||
         f == DType::q6_k;
}

// nb blocks of x (nb * 256 values) rounded: d = max |x| / 127 per block,
// qs = round-to-nearest-even(x / d); an all-zero block gets d = 0; a block
// holding inf or NaN gets d = NaN.
void quantize_q8k(const float* x, BlockQ8K* y, int64_t nb);

// A k-quant block unpacked: its quants as the signed values the products use
// (Q2_K 0..3, Q3_K -4..3, Q4_K 0..15, Q5_K 0..31, Q6_K -32..31), its integer
// scales per group of 16 (Q4_K/Q5_K's groups of 32 give two each), the mins
// likewise (0 for Q3_K, Q6_K), and its f16 d and dmin (0 without mins) as
// f32: value v = (d * sc[v / 16]) * q[v] - dmin * mn[v / 16], which is ggml's
// dequantization, operation for operation.
struct KUnpacked {
  int8_t q[kQK];
  int sc[16];
  int mn[16];
  float d, dmin;
};
void kquant_unpack(DType f, const uint8_t* block, KUnpacked& u);

// nb blocks of a k-quant as f32, bit-exact with kiln::dequantize_row (ggml's
// dequantizer) and vectorized (qmatmul_kquant_dequant.cpp).
void kquant_dequantize(DType f, const uint8_t* blocks, int64_t nb, float* out);

// One row of W (nb blocks of format f) times one rounded row of x.
using KQuantDot = float (*)(const uint8_t* w, const BlockQ8K* x, int64_t nb);

// The plain C++ dot of format f (every build has it; tests compare paths).
KQuantDot kquant_dot_portable(DType f);
// The dot the row-dot path uses: AVX2 where the build has it and the format
// has one (kquant_dot_avx2, qmatmul_kquant_avx2.cpp), else the portable one.
KQuantDot kquant_dot(DType f);
// nullptr where the build lacks AVX2 or the format has no AVX2 dot.
KQuantDot kquant_dot_avx2(DType f);

}  // namespace kiln::cpu::qmatmul_detail
