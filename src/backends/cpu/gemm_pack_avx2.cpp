// AVX2 packing fast paths for unit-stride operands (row-major and transposed
// views), with f16 / bf16 -> f32 conversion in registers and f32 operands read
// rounded to bf16 (round_bf16: a bf16 training graph's weights and gradients on
// CPUs without AVX512_BF16). The transposing cases go through 8x8 in-register
// transposes. Same packed values as the portable code in gemm_pack.cpp.
#include "backends/cpu/gemm_internal.h"

#if defined(KILN_GEMM_AVX2)
#include <cstring>
#include <type_traits>

#include "backends/cpu/intrinsics.h"

namespace kiln::cpu::gemm_detail {
namespace {

static_assert(MR == 6 && NR == 16, "the A panel is stored 6 floats per k, B strips as 2 vectors");

// What an element is read as: its type, and for f32 whether it is rounded.
enum class Src { f32, f32_round, f16, bf16 };

constexpr int64_t elem_size(Src s) { return s == Src::f32 || s == Src::f32_round ? 4 : 2; }

inline __m256i lane_mask(int n) {  // lanes < n all ones
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// x rounded to bf16 as f32_to_bf16_daz (gemm_convert.h) rounds, widened back:
// nearest even, NaN quiet, subnormals as signed zero.
inline __m256 round_bf16(__m256 x) {
  const __m256i u = _mm256_castps_si256(x), hi = _mm256_set1_epi32(int(0xffff0000u));
  const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r =
      _mm256_and_si256(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), odd)), hi);
  const __m256i quiet = _mm256_and_si256(_mm256_or_si256(u, _mm256_set1_epi32(0x400000)), hi);
  r = _mm256_blendv_epi8(r, quiet, _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000)));
  const __m256i sign = _mm256_and_si256(u, _mm256_set1_epi32(int(0x80000000u)));
  r = _mm256_blendv_epi8(r, sign, _mm256_cmpgt_epi32(_mm256_set1_epi32(0x00800000), abs));
  return _mm256_castsi256_ps(r);
}

// n (0..8) consecutive 16-bit elements, lanes past n 0 (AVX2 has no 16-bit
// masked loads; a short row of a transposed A, 6 elements, is the common case).
inline __m128i load_u16_n(const uint16_t* s, int n) {
  if (n >= 8) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(s));
  const auto word = [&](int i) {  // elements i and i + 1
    int32_t w;
    std::memcpy(&w, s + i, 4);
    return w;
  };
  __m128i h = n >= 4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s)) : _mm_setzero_si128();
  switch (n) {
    case 7: h = _mm_insert_epi16(h, s[6], 6); [[fallthrough]];
    case 6: return _mm_insert_epi32(h, word(4), 2);
    case 5: return _mm_insert_epi16(h, s[4], 4);
    case 4: return h;
    case 3: h = _mm_insert_epi16(h, s[2], 2); [[fallthrough]];
    case 2: return _mm_insert_epi32(h, word(0), 0);
    case 1: return _mm_insert_epi16(h, s[0], 0);
    default: return h;
  }
}

// Loads n (0..8) consecutive elements as f32; lanes past n are 0.
template <Src S>
inline __m256 load_n(const void* p, int n) {
  if constexpr (S == Src::f32 || S == Src::f32_round) {
    const __m256 v = n >= 8 ? _mm256_loadu_ps(static_cast<const float*>(p))
                            : _mm256_maskload_ps(static_cast<const float*>(p), lane_mask(n));
    if constexpr (S == Src::f32_round) return round_bf16(v);
    return v;
  } else {
    const __m128i h = load_u16_n(static_cast<const uint16_t*>(p), n);
    if constexpr (S == Src::bf16)
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
#if defined(__F16C__)  // (f16 operands take this path only with F16C)
    else return _mm256_cvtph_ps(h);
#endif
  }
}

// In-register transpose of an 8x8 f32 block.
inline void transpose8(__m256 r[8]) {
  __m256 t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  __m256 s[8];
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xee);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xee);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

// Reads a rows x cols block (rows, cols <= 8) whose rows are contiguous (row r
// at src + r*ld_bytes), transposes it and calls put(c, v) for each column
// c < cols with v = that column (lanes past `rows` are 0).
template <Src S, class Put>
inline void transpose_block(const char* src, int64_t ld_bytes, int rows, int cols, Put put) {
  __m256 r[8];
  for (int i = 0; i < 8; ++i)
    r[i] = i < rows ? load_n<S>(src + i * ld_bytes, cols) : _mm256_setzero_ps();
  transpose8(r);
  for (int c = 0; c < cols; ++c) put(c, r[c]);
}

// The 6 floats of an A panel's k (lanes 0..5 of v).
inline void store6(float* d, __m256 v) {
  _mm_storeu_ps(d, _mm256_castps256_ps128(v));
  _mm_storel_pi(reinterpret_cast<__m64*>(d + 4), _mm256_extractf128_ps(v, 1));
}

template <Src S>
void pack_a_t(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  constexpr int64_t es = elem_size(S);
  const char* base = static_cast<const char*>(A.data);
  for (int64_t p = 0; p < mc; p += MR, dst += kc * MR) {
    const int mv = int(mc - p < MR ? mc - p : MR);
    const char* src = base + ((i0 + p) * A.rs + k0 * A.cs) * es;
    if (A.rs == 1) {  // column of the panel contiguous: one load per k
      // 8 elements when the block has 2 more rows (all in bounds; store6 keeps
      // 6), else the panel's rows with the rest 0.
      const int64_t ld = A.cs * es;
      const int n = p + 8 <= mc ? 8 : mv;
      for (int64_t k = 0; k < kc; ++k) store6(dst + k * MR, load_n<S>(src + k * ld, n));
    } else {  // rows contiguous in k: transpose 8-column blocks
      const int64_t ld = A.rs * es;
      for (int64_t kb = 0; kb < kc; kb += 8) {
        const int kn = int(kc - kb < 8 ? kc - kb : 8);
        float* d = dst + kb * MR;
        transpose_block<S>(src + kb * es, ld, mv, kn,
                           [&](int c, __m256 v) { store6(d + c * MR, v); });
      }
    }
  }
}

template <Src S>
void pack_b_t(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  constexpr int64_t es = elem_size(S);
  const char* base = static_cast<const char*>(B.data);
  for (int64_t s0 = 0; s0 < nc; s0 += NR, dst += kc * NR) {
    const int nv = int(nc - s0 < NR ? nc - s0 : NR);
    const char* src = base + (k0 * B.rs + (j0 + s0) * B.cs) * es;
    if (B.cs == 1) {  // rows contiguous: two loads per k
      const int64_t ld = B.rs * es;
      for (int64_t k = 0; k < kc; ++k) {
        _mm256_storeu_ps(dst + k * NR, load_n<S>(src + k * ld, nv));
        _mm256_storeu_ps(dst + k * NR + 8, load_n<S>(src + k * ld + 8 * es, nv - 8));
      }
    } else {  // columns contiguous in k: transpose 8x8 blocks
      const int64_t ld = B.cs * es;
      for (int v = 0; v < NR / 8; ++v) {
        const int cols = nv - 8 * v;
        if (cols <= 0) {
          for (int64_t k = 0; k < kc; ++k)
            _mm256_storeu_ps(dst + k * NR + 8 * v, _mm256_setzero_ps());
          continue;
        }
        for (int64_t kb = 0; kb < kc; kb += 8) {
          const int kn = int(kc - kb < 8 ? kc - kb : 8);
          float* d = dst + kb * NR + 8 * v;
          transpose_block<S>(src + (8 * v * B.cs + kb) * es, ld, cols < 8 ? cols : 8, kn,
                             [&](int c, __m256 x) { _mm256_storeu_ps(d + c * NR, x); });
        }
      }
    }
  }
}

// Calls f(std::integral_constant<Src, S>{}) for x's element source S and
// returns true, or returns false for the cases the portable code takes:
// neither stride 1, or f16 without F16C (x86-64-v3 and AVX2 CPUs'
// -march=native have it).
template <class F>
bool with_source(const GemmOperand& x, F f) {
  if (x.rs != 1 && x.cs != 1) return false;
  switch (x.type) {
    case GemmType::f32:
      if (x.round_bf16) f(std::integral_constant<Src, Src::f32_round>{});
      else f(std::integral_constant<Src, Src::f32>{});
      return true;
    case GemmType::f16:
#if defined(__F16C__)
      f(std::integral_constant<Src, Src::f16>{});
      return true;
#else
      return false;
#endif
    case GemmType::bf16: f(std::integral_constant<Src, Src::bf16>{}); return true;
  }
  return false;
}

}  // namespace

bool pack_a_simd(const GemmOperand& A, int64_t i0, int64_t k0, int64_t mc, int64_t kc, float* dst) {
  return with_source(A, [&](auto s) { pack_a_t<decltype(s)::value>(A, i0, k0, mc, kc, dst); });
}

bool pack_b_simd(const GemmOperand& B, int64_t k0, int64_t j0, int64_t kc, int64_t nc, float* dst) {
  return with_source(B, [&](auto s) { pack_b_t<decltype(s)::value>(B, k0, j0, kc, nc, dst); });
}

}  // namespace kiln::cpu::gemm_detail
#endif  // KILN_GEMM_AVX2
