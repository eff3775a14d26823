// kiln::cpu::qmatmul_xwt / qmatmul_xw against a double-precision
// dequantize-then-multiply reference, with padded strides, on 1 and 2 threads
// (which must give the same bits), for every format of kiln/quant_types.def:
// Q8_0 / Q4_0 on random blocks built directly (random int8 / nibble quants,
// random f16 scales), the others quantized from random values by
// kiln::quantize_row (rows of different magnitudes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/qmatmul.h"
#include "backends/cpu/qmatmul_internal.h"
#include "backends/cpu/qmatmul_kquant.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"
#include "kiln/error.h"

using kiln::DType;
using kiln::cpu::BlockQ4_0;
using kiln::cpu::BlockQ8_0;
using kiln::cpu::QuantMatrix;
using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

namespace {

constexpr double kUnit = 1.0 / (1 << 24);  // f32 unit roundoff

// A random quantized W [n, k] with `pad` spare bytes after each row, and its
// dequantized values in double.
struct QuantW {
  DType format;
  int64_t n, k;
  std::vector<uint8_t> bytes;
  std::vector<double> deq;  // [n, k]
  size_t stride;
  std::vector<double> off;  // [n, k]: min_offsets

  QuantMatrix view() const { return {bytes.data(), format, n, k, stride}; }
};

// f16 bits with a random sign, exponent 2^-6 .. 2^4 and mantissa; now and then
// zero or a subnormal.
uint16_t random_scale(std::mt19937& rng) {
  const uint32_t r = rng();
  const uint16_t sign = (r & 1) ? 0x8000 : 0;
  const uint16_t mant = uint16_t((r >> 1) & 0x3ff);
  if ((r >> 12) % 64 == 0) return sign | mant;  // subnormal or zero
  const uint16_t exp = uint16_t(9 + (r >> 18) % 11);
  return uint16_t(sign | exp << 10 | mant);
}

// |offset| of each value's group for the formats whose blocks add a min
// (Q2_K, Q4_K, Q5_K: value = d scale q - dmin min; Q4_1, Q5_1: value = d q +
// m): the dots multiply the two terms separately, so f32 rounding is relative
// to |d scale q| + |dmin min| <= |value| + 2 |offset|. The offset is the value
// of quant 0: the block with its quant bytes zeroed, dequantized. Zero for the
// other formats.
std::vector<double> min_offsets(DType f, const uint8_t* row, int64_t k) {
  std::vector<double> off(size_t(k), 0.0);
  int64_t q0 = 0, q1 = 0;  // the quant bytes of a block
  if (f == DType::q2_k) q0 = 16, q1 = 80;
  else if (f == DType::q4_k) q0 = 16, q1 = 144;
  else if (f == DType::q5_k) q0 = 16, q1 = 176;
  else if (f == DType::q4_1) q0 = 4, q1 = 20;
  else if (f == DType::q5_1) q0 = 4, q1 = 24;
  else return off;
  const int64_t B = kiln::dtype_block_elems(f);
  const size_t bb = kiln::dtype_size(f);
  std::vector<uint8_t> blk(bb);
  std::vector<float> v(static_cast<size_t>(B));
  for (int64_t b = 0; b < k / B; ++b) {
    std::memcpy(blk.data(), row + b * bb, bb);
    std::memset(blk.data() + q0, 0, size_t(q1 - q0));
    kiln::dequantize_row(f, blk.data(), v.data(), B);
    for (int64_t l = 0; l < B; ++l) off[size_t(b * B + l)] = std::abs(double(v[size_t(l)]));
  }
  return off;
}

QuantW random_w(DType f, int64_t n, int64_t k, size_t pad, std::mt19937& rng) {
  QuantW w{f, n, k, {}, std::vector<double>(size_t(n * k)), kiln::cpu::quant_row_bytes(f, k) + pad};
  w.bytes.resize(w.stride * size_t(n) + 1);
  for (auto& b : w.bytes) b = uint8_t(rng());  // padding is garbage, never read as values
  if (f != DType::q8_0 && f != DType::q4_0) {
    std::vector<float> v(static_cast<size_t>(k));
    for (int64_t j = 0; j < n; ++j) {
      const float scale = std::ldexp(1.f, int(rng() % 9) - 4);  // 2^-4 .. 2^4
      std::normal_distribution<float> g(0.f, scale);
      for (auto& e : v) e = g(rng);
      uint8_t* row = w.bytes.data() + size_t(j) * w.stride;
      kiln::quantize_row(f, v.data(), row, k);
      kiln::dequantize_row(f, row, v.data(), k);
      for (int64_t c = 0; c < k; ++c) w.deq[size_t(j * k + c)] = v[size_t(c)];
      const std::vector<double> off = min_offsets(f, row, k);
      w.off.insert(w.off.end(), off.begin(), off.end());
    }
    return w;
  }
  w.off.assign(size_t(n * k), 0.0);
  for (int64_t j = 0; j < n; ++j) {
    uint8_t* row = w.bytes.data() + size_t(j) * w.stride;
    for (int64_t b = 0; b < k / 32; ++b) {
      const uint16_t dh = random_scale(rng);
      const double d = kiln::f16_to_f32(dh);
      double* out = w.deq.data() + j * k + b * 32;
      if (f == DType::q8_0) {
        BlockQ8_0 blk;
        blk.d = dh;
        for (int l = 0; l < 32; ++l) blk.qs[l] = int8_t(rng());
        std::memcpy(row + b * sizeof(blk), &blk, sizeof(blk));
        for (int l = 0; l < 32; ++l) out[l] = d * blk.qs[l];
      } else {
        BlockQ4_0 blk;
        blk.d = dh;
        for (int l = 0; l < 16; ++l) blk.qs[l] = uint8_t(rng());
        std::memcpy(row + b * sizeof(blk), &blk, sizeof(blk));
        for (int l = 0; l < 16; ++l) {
          out[l] = d * (int(blk.qs[l] & 15) - 8);
          out[l + 16] = d * (int(blk.qs[l] >> 4) - 8);
        }
      }
    }
  }
  return w;
}

// rows x cols f32 values in [-2, 2] with row stride ld; the padding is NaN so a
// read of it shows up in the result.
std::vector<float> random_rows(int64_t rows, int64_t cols, int64_t ld, std::mt19937& rng) {
  std::vector<float> v(size_t(rows * ld), std::numeric_limits<float>::quiet_NaN());
  std::uniform_real_distribution<float> u(-2.f, 2.f);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < cols; ++c) v[size_t(i * ld + c)] = u(rng);
  return v;
}

constexpr float kSentinel = 12345.f;

template <class Fn>
std::vector<float> run_on(int nth, size_t out_size, Fn fn) {
  std::vector<float> out(out_size, kSentinel);
  if (nth == 1) {
    ThreadCtx t;
    fn(out.data(), t);
  } else {
    ThreadPool pool(nth);
    pool.run([&](ThreadCtx& t) { fn(out.data(), t); });
  }
  return out;
}

// out[i, j] = sum_c a[i, c] * b(j, c) checked against the double reference:
// |out - ref| <= (len + 8) u sum |a b| (f32 accumulation over len terms), plus
// extra[i, j] where given.
void expect_close(const std::vector<float>& out, int64_t ld_out, int64_t rows, int64_t cols,
                  const std::vector<double>& ref, const std::vector<double>& mag, int64_t len,
                  const char* what, const std::vector<double>* extra = nullptr) {
  int bad = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double got = out[size_t(i * ld_out + j)], want = ref[size_t(i * cols + j)];
      const double tol = double(len + 8) * kUnit * mag[size_t(i * cols + j)] +
                         (extra ? (*extra)[size_t(i * cols + j)] : 0.0);
      if (!(std::abs(got - want) <= tol) && ++bad <= 5)
        ADD_FAILURE() << what << " [" << i << ", " << j << "]: " << got << " vs " << want
                      << " (tolerance " << tol << ")";
    }
    for (int64_t j = cols; j < ld_out; ++j)
      ASSERT_EQ(out[size_t(i * ld_out + j)], kSentinel) << what << ": padding written";
  }
  EXPECT_EQ(bad, 0) << what;
}

struct QmatmulCase {
  DType f;
  int64_t m, n, k;
};

std::string name(const char* fn, const QmatmulCase& c) {
  std::ostringstream os;
  os << fn << " " << kiln::dtype_name(c.f) << " m=" << c.m << " n=" << c.n << " k=" << c.k;
  return os.str();
}

void check_xwt(const QmatmulCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const QuantW w = random_w(c.f, c.n, c.k, 7, rng);
  const int64_t ldx = c.k + 5, ldy = c.n + 3;
  const std::vector<float> x = random_rows(c.m, c.k, ldx, rng);
  // Where x is rounded to int8 blocks (the k-quants' decode path: blocks of
  // 256, x_r = d * q as quantize_q8k computes it; the decode path of the
  // 32-value formats on AVX2 and of Q8_0 / Q4_0 on VNNI builds: x_r = dx *
  // round(x / dx) per block of 32, dx = max |x| / 127, rounded as the kernel
  // does in f32), y must be W @ x_r up to
  // f32 rounding (tight), and W @ x within the documented bound
  // sum |w| dx / 2 (+ f32 rounding).
  const bool rounds = kiln::cpu::qmatmul_xwt_rounds_x(c.f, c.m);
  const bool kq = kiln::cpu::qmatmul_detail::is_k_quant(c.f);
  std::vector<double> xr(size_t(c.m * c.k)), half_step(xr.size(), 0.0);
  for (int64_t i = 0; i < c.m; ++i) {
    if (rounds && kq) {
      using kiln::cpu::qmatmul_detail::BlockQ8K;
      std::vector<BlockQ8K> q(size_t(c.k / 256));
      kiln::cpu::qmatmul_detail::quantize_q8k(x.data() + i * ldx, q.data(), c.k / 256);
      for (int64_t v = 0; v < c.k; ++v) {
        const BlockQ8K& b = q[size_t(v / 256)];
        const size_t at = size_t(i * c.k + v);
        xr[at] = double(b.d) * b.qs[v % 256];
        half_step[at] = double(b.d) / 2;
      }
      continue;
    }
    for (int64_t b = 0; b < c.k / 32; ++b) {
      const float* xb = x.data() + i * ldx + b * 32;
      float amax = 0;
      for (int v = 0; v < 32; ++v) amax = std::max(amax, std::abs(xb[v]));
      for (int v = 0; v < 32; ++v) {
        const size_t at = size_t(i * c.k + b * 32 + v);
        xr[at] = xb[v];
        const float dx = amax / 127, inv = 127 / amax;
        if (!rounds || !std::isfinite(inv)) continue;
        xr[at] = double(dx) * std::nearbyint(xb[v] * inv);
        half_step[at] = double(amax) / 127 / 2;
      }
    }
  }
  std::vector<double> ref(size_t(c.m * c.n)), mag(ref.size()), ref_r(ref.size()), mag_r(ref.size()),
      extra(ref.size());
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0, a = 0, sr = 0, ar = 0, e = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        const size_t at = size_t(i * c.k + q);
        const double xv = x[size_t(i * ldx + q)], wv = w.deq[size_t(j * c.k + q)];
        const double wm = std::abs(wv) + 2 * w.off[size_t(j * c.k + q)];
        s += xv * wv, sr += xr[at] * wv;
        a += wm * (std::abs(xv) + half_step[at]), ar += wm * std::abs(xr[at]);
        e += std::abs(wv) * half_step[at];
      }
      const size_t o = size_t(i * c.n + j);
      ref[o] = s, mag[o] = a, ref_r[o] = sr, mag_r[o] = ar, extra[o] = e * (1 + 1e-6);
    }
  auto fn = [&](float* y, ThreadCtx& t) {
    kiln::cpu::qmatmul_xwt(w.view(), x.data(), ldx, y, ldy, c.m, t);
  };
  const auto y1 = run_on(1, size_t(c.m * ldy), fn);
  const auto y2 = run_on(2, size_t(c.m * ldy), fn);
  const std::string what = name("xwt", c);
  expect_close(y1, ldy, c.m, c.n, ref_r, mag_r, c.k, (what + " vs W @ x_r").c_str());
  expect_close(y1, ldy, c.m, c.n, ref, mag, c.k, what.c_str(), &extra);
  EXPECT_EQ(std::memcmp(y1.data(), y2.data(), y1.size() * sizeof(float)), 0)
      << what << ": 1 and 2 threads differ";
}

void check_xw(const QmatmulCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const QuantW w = random_w(c.f, c.n, c.k, 11, rng);
  const int64_t lddy = c.n + 2, lddx = c.k + 9;
  const std::vector<float> dy = random_rows(c.m, c.n, lddy, rng);
  std::vector<double> ref(size_t(c.m * c.k), 0.0), mag(ref.size(), 0.0);
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      const double g = dy[size_t(i * lddy + j)];
      for (int64_t q = 0; q < c.k; ++q) {
        const double p = g * w.deq[size_t(j * c.k + q)];
        ref[size_t(i * c.k + q)] += p, mag[size_t(i * c.k + q)] += std::abs(p);
      }
    }
  auto fn = [&](float* dx, ThreadCtx& t) {
    kiln::cpu::qmatmul_xw(w.view(), dy.data(), lddy, dx, lddx, c.m, t);
  };
  const auto d1 = run_on(1, size_t(c.m * lddx), fn);
  const auto d2 = run_on(2, size_t(c.m * lddx), fn);
  const std::string what = name("xw", c);
  expect_close(d1, lddx, c.m, c.k, ref, mag, c.n, what.c_str());
  EXPECT_EQ(std::memcmp(d1.data(), d2.data(), d1.size() * sizeof(float)), 0)
      << what << ": 1 and 2 threads differ";
}

std::vector<QmatmulCase> cases() {
  std::vector<QmatmulCase> out;
  for (DType f : {DType::q8_0, DType::q4_0})
    for (int64_t k : {32, 64, 576, 1536})
      for (int64_t m : {1, 3, 17, 512}) out.push_back({f, m, m == 512 ? 67 : 101, k});
  // The other formats: blocks of 32 (Q4_1, Q5_0, Q5_1) or 256 (the k-quants).
  for (const kiln::QuantType& q : kiln::kQuantTypes) {
    if (q.dtype == DType::q8_0 || q.dtype == DType::q4_0) continue;
    for (int64_t k : {int64_t(q.block_elems), int64_t(6 * 256)})
      for (int64_t m : {1, 4, 300}) out.push_back({q.dtype, m, m == 300 ? 37 : 45, k});
  }
  return out;
}

}  // namespace

TEST(QMatmul, XwtMatchesDequantizedProduct) {
  uint32_t seed = 1;
  for (const QmatmulCase& c : cases()) check_xwt(c, seed++);
}

TEST(QMatmul, XwMatchesDequantizedProduct) {
  uint32_t seed = 100;
  for (const QmatmulCase& c : cases()) check_xw(c, seed++);
}

// dy @ W with more rows of W than one dequantized tile holds (the tiles' partial
// products are accumulated), and x @ W^T over several row tiles.
TEST(QMatmul, ManyRowsOfW) {
  for (DType f : {DType::q8_0, DType::q4_0}) {
    check_xw({f, 5, 2051, 96}, 7);
    check_xw({f, 1, 1031, 64}, 8);
    check_xwt({f, 33, 1031, 64}, 9);
    check_xwt({f, 2, 1031, 64}, 10);
  }
  // 256-value blocks: dy @ W's tiles are 256 columns by 256 rows.
  for (DType f : {DType::q4_k, DType::q6_k}) {
    check_xw({f, 3, 600, 512}, 11);
    check_xwt({f, 7, 130, 512}, 12);
  }
}

// The k-quants' x rounding (quantize_q8k): d = max |x| / 127 per block of 256,
// every value within half a step, the 16-sums those of the quants; a zero
// block gives d = 0, a non-finite one d = NaN.
TEST(QMatmul, KQuantXRounding) {
  using kiln::cpu::qmatmul_detail::BlockQ8K;
  std::mt19937 rng(21);
  std::vector<float> x = random_rows(1, 3 * 256, 3 * 256, rng);
  for (int v = 256; v < 512; ++v) x[size_t(v)] = 0;
  x[600] = std::numeric_limits<float>::infinity();
  BlockQ8K q[3];
  kiln::cpu::qmatmul_detail::quantize_q8k(x.data(), q, 3);
  float amax = 0;
  for (int v = 0; v < 256; ++v) amax = std::max(amax, std::abs(x[size_t(v)]));
  EXPECT_EQ(q[0].d, amax / 127);
  for (int v = 0; v < 256; ++v)
    EXPECT_LE(std::abs(double(x[size_t(v)]) - double(q[0].d) * q[0].qs[v]),
              double(q[0].d) / 2 * (1 + 1e-6))
        << v;
  for (int g = 0; g < 16; ++g) {
    int s = 0;
    for (int v = 0; v < 16; ++v) s += q[0].qs[16 * g + v];
    EXPECT_EQ(q[0].bsums[g], s) << g;
  }
  EXPECT_EQ(q[1].d, 0.f);
  EXPECT_TRUE(std::isnan(q[2].d));
}

// The GEMM paths' k-quant tiles (kquant_dequantize, vectorized) are
// kiln::dequantize_row's values bit for bit, on random bytes (any scale,
// subnormal, inf or NaN included).
TEST(QMatmul, KQuantTilesAreTheDequantizedValues) {
  std::mt19937 rng(77);
  for (const kiln::QuantType& qt : kiln::kQuantTypes) {
    if (!kiln::cpu::qmatmul_detail::is_k_quant(qt.dtype)) continue;
    const int64_t nb = 64;
    std::vector<uint8_t> blocks(size_t(nb) * qt.block_bytes);
    for (auto& b : blocks) b = uint8_t(rng());
    std::vector<float> want(size_t(nb * 256)), got(want.size());
    kiln::dequantize_row(qt.dtype, blocks.data(), want.data(), nb * 256);
    kiln::cpu::qmatmul_detail::kquant_dequantize(qt.dtype, blocks.data(), nb, got.data());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0) << qt.name;
  }
}

// Each k-quant's portable dot and (where the build has it) its AVX2 dot
// against the double product of the dequantized row and the rounded x: the
// same integers, so both within f32 rounding of it.
TEST(QMatmul, KQuantDotPaths) {
  using namespace kiln::cpu::qmatmul_detail;
  uint32_t seed = 500;
  int avx2 = 0;
  for (const kiln::QuantType& qt : kiln::kQuantTypes) {
    if (!is_k_quant(qt.dtype)) continue;
    std::mt19937 rng(seed++);
    const int64_t k = 4 * 256;
    const QuantW w = random_w(qt.dtype, 3, k, 0, rng);
    const std::vector<float> x = random_rows(1, k, k, rng);
    std::vector<BlockQ8K> xq(4);
    quantize_q8k(x.data(), xq.data(), 4);
    for (int64_t j = 0; j < 3; ++j) {
      double want = 0, mag = 0;
      for (int64_t c = 0; c < k; ++c) {
        const double xr = double(xq[size_t(c / 256)].d) * xq[size_t(c / 256)].qs[c % 256];
        const double wv = w.deq[size_t(j * k + c)];
        want += wv * xr;
        mag += (std::abs(wv) + 2 * w.off[size_t(j * k + c)]) * std::abs(xr);
      }
      const uint8_t* row = w.bytes.data() + size_t(j) * w.stride;
      for (KQuantDot dot : {kquant_dot_portable(qt.dtype), kquant_dot_avx2(qt.dtype)}) {
        if (!dot) continue;
        avx2 += dot != kquant_dot_portable(qt.dtype);
        EXPECT_NEAR(dot(row, xq.data(), 4), want, 16 * kUnit * mag) << qt.name << " row " << j;
      }
    }
  }
#if defined(__AVX2__)
  EXPECT_GE(avx2, 9) << "Q4_K, Q5_K and Q6_K have AVX2 dots";
#endif
}

// Odd block counts (the VNNI path pairs blocks, an odd last one pairs with
// itself, inside and after a chunk of 16 blocks; the AVX2 int8 path converts
// scales 8 blocks at a time) for 1 to 4 rows of x, on every 32-value format.
TEST(QMatmul, OddBlockCounts) {
  uint32_t seed = 300;
  for (DType f : {DType::q8_0, DType::q4_0, DType::q4_1, DType::q5_0, DType::q5_1})
    for (int64_t k : {96, 544, 1120})
      for (int64_t m : {1, 2, 3, 4}) check_xwt({f, m, 13, k}, seed++);
}

// Which kernel decodes each format (qmatmul_internal.h's row_dot, the one place
// that says it), and that the rounding paths say so: on AVX2 builds without
// AVX-512 every 32-value format takes the int8 path; AVX-512 builds keep their
// own Q8_0 / Q4_0 kernels (int8 with VNNI); builds without AVX2 the f32 ones.
TEST(QMatmul, RowDotKernelOfEachFormat) {
  using kiln::cpu::qmatmul_detail::row_dot;
  using kiln::cpu::qmatmul_detail::RowDot;
  for (const kiln::QuantType& qt : kiln::kQuantTypes) {
    const RowDot k = row_dot(qt.dtype);
    const bool rounds = kiln::cpu::qmatmul_xwt_rounds_x(qt.dtype, 1);
    if (qt.block_elems == 256) {
      EXPECT_EQ(k, RowDot::kquant) << qt.name;
      EXPECT_TRUE(rounds) << qt.name;
      continue;
    }
    const bool isa_format = qt.dtype == DType::q8_0 || qt.dtype == DType::q4_0;
#if defined(KILN_QMATMUL_INT8_AVX2) && !defined(KILN_GEMM_AVX512)
    EXPECT_EQ(k, RowDot::int8_avx2) << qt.name;
#elif defined(KILN_QMATMUL_INT8_AVX2)
    EXPECT_EQ(k, isa_format ? RowDot::isa : RowDot::int8_avx2) << qt.name;
#else
    EXPECT_EQ(k, isa_format ? RowDot::isa : RowDot::generic) << qt.name;
#endif
    if (k == RowDot::int8_avx2) EXPECT_TRUE(rounds) << qt.name;
    if (k == RowDot::generic) EXPECT_FALSE(rounds) << qt.name;
    EXPECT_FALSE(kiln::cpu::qmatmul_xwt_rounds_x(qt.dtype, 5)) << qt.name;  // the GEMM path
  }
}

// A non-finite x value makes the outputs that read it non-finite, on every path
// (the int8 path cannot round it: its block's outputs become NaN).
TEST(QMatmul, NonFiniteXPropagates) {
  for (DType f : {DType::q8_0, DType::q4_0, DType::q4_k, DType::q6_k, DType::q5_0})
    for (int64_t m : {1, 6}) {
      const int64_t K = kiln::dtype_block_elems(f) == 256 ? 256 : 64;
      std::mt19937 rng(5);
      const QuantW w = random_w(f, 9, K, 0, rng);
      std::vector<float> x = random_rows(m, K, K, rng);
      x[size_t(40)] = std::numeric_limits<float>::infinity();
      x[size_t((m - 1) * K + 3)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> y(size_t(m * 9));
      ThreadCtx t;
      kiln::cpu::qmatmul_xwt(w.view(), x.data(), K, y.data(), 9, m, t);
      for (int64_t j = 0; j < 9; ++j) {
        EXPECT_FALSE(std::isfinite(y[size_t(j)]))
            << kiln::dtype_name(f) << " m=" << m << " j=" << j;
        EXPECT_TRUE(std::isnan(y[size_t((m - 1) * 9 + j)]))
            << kiln::dtype_name(f) << " m=" << m << " j=" << j;
      }
      if (m > 1) {
        EXPECT_TRUE(std::isfinite(y[size_t(9)])) << kiln::dtype_name(f);  // row 1 is finite
      }
    }
}

TEST(QMatmul, EmptyShapes) {
  std::mt19937 rng(3);
  const QuantW w = random_w(DType::q4_0, 0, 64, 0, rng);
  std::vector<float> dy(4 * 1, 0.f), dx(4 * 64, kSentinel);
  ThreadCtx t;
  // n = 0: dx = dy @ W is all zeros.
  kiln::cpu::qmatmul_xw(w.view(), dy.data(), 1, dx.data(), 64, 4, t);
  for (float v : dx) EXPECT_EQ(v, 0.f);
  // m = 0 touches nothing.
  kiln::cpu::qmatmul_xwt(w.view(), nullptr, 64, nullptr, 0, 0, t);
}

TEST(QMatmul, BadShapesThrow) {
  {  // a k-quant row is whole blocks of 256
    std::vector<uint8_t> kb(144 * 4);
    std::vector<float> x(512), y(4);
    ThreadCtx t;
    const QuantMatrix k_odd{kb.data(), DType::q4_k, 2, 288, 288};
    EXPECT_THROW(kiln::cpu::qmatmul_xwt(k_odd, x.data(), 288, y.data(), 2, 1, t), kiln::Error);
  }
  std::vector<uint8_t> bytes(34 * 4);
  std::vector<float> x(64), y(64);
  ThreadCtx t;
  const QuantMatrix odd{bytes.data(), DType::q8_0, 2, 48, 68};
  EXPECT_THROW(kiln::cpu::qmatmul_xwt(odd, x.data(), 48, y.data(), 2, 1, t), kiln::Error);
  const QuantMatrix short_stride{bytes.data(), DType::q8_0, 2, 64, 40};
  EXPECT_THROW(kiln::cpu::qmatmul_xw(short_stride, x.data(), 2, y.data(), 64, 1, t), kiln::Error);
  const QuantMatrix ok{bytes.data(), DType::q8_0, 2, 64, 68};
  EXPECT_THROW(kiln::cpu::qmatmul_xwt(ok, x.data(), 32, y.data(), 2, 2, t), kiln::Error);
}
