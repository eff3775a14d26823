// Portable GEMM micro-kernel (plain C++; the compiler vectorizes the j loops).
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_GENERIC)

namespace kiln::cpu::gemm_detail {

void kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c, int64_t ldc,
            int m, int n, bool add_c, const float* bias) {
  float acc[MR][NR] = {};
  for (int64_t k = 0; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      const float ai = a[i];
      for (int j = 0; j < NR; ++j) acc[i][j] += ai * b[j];
    }
    a += MR;
    b += NR;
  }
  for (int i = 0; i < m; ++i) {
    float* p = c + i * ldc;
    for (int j = 0; j < n; ++j) {
      float x = add_c ? acc[i][j] + p[j] : acc[i][j];
      if (bias) x += bias[j];
      p[j] = x;
    }
  }
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_GENERIC
