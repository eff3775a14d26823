// The k-quants' dequantization for the GEMM paths' tiles (prefill, dy @ W):
// each block unpacked to bytes (kquant_unpack), then per group of 16
// v = (d * sc) * q - dmin * mn in f32, the products and the difference each
// rounded, as ggml's dequantize_row_q*_k computes them, so the tile is the
// dequantized weight bit for bit. CMakeLists.txt compiles this file with
// -ffp-contract=off: a fused multiply-add would round once where ggml rounds
// twice. The loops are plain so the compiler vectorizes them (AVX2: 8 values
// per instruction).
#include "backends/cpu/qmatmul_kquant.h"

namespace kiln::cpu::qmatmul_detail {

void kquant_dequantize(DType f, const uint8_t* blocks, int64_t nb, float* out) {
  const size_t bb = dtype_size(f);
  KUnpacked u;
  for (int64_t b = 0; b < nb; ++b, blocks += bb, out += kQK) {
    kquant_unpack(f, blocks, u);
    for (int g = 0; g < 16; ++g) {
      const float a = u.d * float(u.sc[g]), m = u.dmin * float(u.mn[g]);
      for (int v = 16 * g; v < 16 * g + 16; ++v) out[v] = a * float(u.q[v]) - m;
    }
  }
}

}  // namespace kiln::cpu::qmatmul_detail
