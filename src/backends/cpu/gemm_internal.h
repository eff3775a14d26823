// Internals of kiln::cpu::gemm shared by the driver, the packing routines and
// the micro-kernels. The instruction set is chosen at compile time (the library
// is built either with -march=native or for plain x86-64).
//
// Packed layouts (all f32):
//   A block  mc x kc -> ceil(mc/MR) micro-panels, panel p at p*kc*MR,
//            element (i, k) of the panel at [k*MR + i]; rows past mc are 0.
//   B block  kc x nc -> ceil(nc/NR) strips, strip s at s*kc*NR,
//            element (k, j) of the strip at [k*NR + j]; columns past nc are 0.
#pragma once
#include <cstdint>

#include "backends/cpu/gemm.h"

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && defined(__AVX512DQ__)
#define KILN_GEMM_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__)
#define KILN_GEMM_AVX2 1
#else
#define KILN_GEMM_GENERIC 1
#endif

// bf16 x bf16 products on vdpbf16ps (AVX512_BF16: -march=native on Zen 4/5,
// Sapphire Rapids and later); other builds convert bf16 to f32 while packing.
#if defined(KILN_GEMM_AVX512) && defined(__AVX512BF16__)
#define KILN_GEMM_BF16 1
#endif

namespace kiln::cpu::gemm_detail {

#if defined(KILN_GEMM_AVX512)
// 14x32: 28 zmm accumulators + 2 for B + 1 broadcast; per k 28 FMAs against
// 2 vector loads and 14 broadcast loads. (Measured on Zen 5: 12x32, 8x48 and
// 6x64 are within noise of it; KC 192..512 too.)
inline constexpr int MR = 14, NR = 32;
inline constexpr int64_t KC = 256, MC = 14 * 12;
inline constexpr const char* kIsa = "avx512";  // for benchmark labels
#elif defined(KILN_GEMM_AVX2)
inline constexpr int MR = 6, NR = 16;  // 12 ymm accumulators
inline constexpr int64_t KC = 256, MC = 6 * 24;
inline constexpr const char* kIsa = "avx2";
#else
inline constexpr int MR = 4, NR = 8;  // 8 SSE accumulators: no spills on x86-64
inline constexpr int64_t KC = 256, MC = 4 * 32;
inline constexpr const char* kIsa = "generic";
#endif

// C[0:m, 0:n] = (add_c ? C : 0) + Apanel(MR x kc) @ Bstrip(kc x NR), then
// + bias[0:n] on every row when bias is not null, for 1 <= m <= MR,
// 1 <= n <= NR; C(i, j) at c[i*ldc + j]. Each C element is one multiply-add
// chain over k, then one add of the old C when add_c, then one of the bias:
// the same whatever m and n. (The bias is added before the store: added by a
// pass over the tile just stored, its loads waited for those stores.)
void kernel(int64_t kc, const float* a, const float* b, float* c, int64_t ldc, int m, int n,
            bool add_c, const float* bias);

// Packs A[i0 : i0+mc, k0 : k0+kc] into the A-block layout above.
void pack_a(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst);
// Packs B[k0 : k0+kc, j0 : j0+nc] into the B-panel layout above.
void pack_b(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst);

// Instruction-set specific fast paths of the packing routines (unit-stride
// cases); return false when they do not handle the case (then the portable
// code in gemm_pack.cpp runs).
bool pack_a_simd(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst);
bool pack_b_simd(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst);

// GEMMs without packing for a few rows or columns. gemm_small_m.cpp: M <=
// kSmallM (or kSmallMShortK with a short K) and B's rows contiguous; thread ith of nth computes its
// share of N; a32 is scratch for M*K floats. gemm_small_n.cpp: N <= kSmallN (or a small C with a
// long K) and A's rows contiguous; threads split M; b32 is scratch for N*K floats.
inline constexpr int64_t kSmallM = 4, kSmallN = 4;
// With K <= kShortK the unpacked path also wins up to kSmallMShortK rows: packing
// B would cost as much as the product (conv2d with few channels).
inline constexpr int64_t kSmallMShortK = 16, kShortK = 128;
// A small C over a long K is dot products: small_n handles M*N <= kDotMN when
// K >= kDotK (packing would be most of the work).
inline constexpr int64_t kDotMN = 1536, kDotK = 384;
bool small_m_applicable(const GemmArgs& g);
void gemm_small_m(const GemmArgs& g, int ith, int nth, float* a32);
bool small_n_applicable(const GemmArgs& g);
void gemm_small_n(const GemmArgs& g, int ith, int nth, float* b32);

#if defined(KILN_GEMM_BF16)
// The bf16 path (gemm_pack_bf16.cpp, gemm_kernel_avx512.cpp), taken when A and B
// are both bf16. Packed layouts hold k in pairs (kc rounded up to even, the
// extra k zero in both), uint16 bf16 bits:
//   A block  panel p at p*kc2*MR, element (i, k) at [(k/2)*2*MR + 2*i + k%2];
//   B block  strip s at s*kc2*NR, element (k, j) at [(k/2)*2*NR + 2*j + k%2];
// so one 32-bit word of A (two k of row i), broadcast, meets 16 words of B (the
// same two k of 16 columns) in one vdpbf16ps: C(i, j) += a0*b0 + a1*b1 in f32.
// Same MR x NR tile as f32; KC twice as long (same bytes per panel).
inline constexpr int64_t KC_BF16 = 2 * KC;
void kernel_bf16(int64_t kc, const uint16_t* a, const uint16_t* b, float* c, int64_t ldc, int m,
                 int n, bool add_c, const float* bias);
void pack_a_bf16(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc,
                 uint16_t* dst);
void pack_b_bf16(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc,
                 uint16_t* dst);
// The same from f32 operands read rounded (round_bf16; gemm_pack_bf16_round.cpp).
void pack_a_bf16_round(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc,
                       uint16_t* dst);
void pack_b_bf16_round(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc,
                       uint16_t* dst);
#endif

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }

}  // namespace kiln::cpu::gemm_detail
