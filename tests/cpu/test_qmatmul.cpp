// kiln::cpu::qmatmul_xwt / qmatmul_xw against a double-precision
// dequantize-then-multiply reference, on random blocks built directly (random
// int8 / nibble quants, random f16 scales), with padded strides, on 1 and 2
// threads (which must give the same bits).
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

QuantW random_w(DType f, int64_t n, int64_t k, size_t pad, std::mt19937& rng) {
  QuantW w{f, n, k, {}, std::vector<double>(size_t(n * k)), kiln::cpu::quant_row_bytes(f, k) + pad};
  w.bytes.resize(w.stride * size_t(n) + 1);
  for (auto& b : w.bytes) b = uint8_t(rng());  // padding is garbage, never read as values
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

struct Case {
  DType f;
  int64_t m, n, k;
};

std::string name(const char* fn, const Case& c) {
  std::ostringstream os;
  os << fn << (c.f == DType::q8_0 ? " q8_0" : " q4_0") << " m=" << c.m << " n=" << c.n
     << " k=" << c.k;
  return os.str();
}

void check_xwt(const Case& c, uint32_t seed) {
  std::mt19937 rng(seed);
  const QuantW w = random_w(c.f, c.n, c.k, 7, rng);
  const int64_t ldx = c.k + 5, ldy = c.n + 3;
  const std::vector<float> x = random_rows(c.m, c.k, ldx, rng);
  // Where x is rounded to int8 blocks (the decode path of VNNI builds): x_r =
  // dx * round(x / dx) per block of 32, dx = max |x| / 127, rounded as the
  // kernel does in f32. y must be W @ x_r up to f32 rounding (tight), and W @ x
  // within the documented bound sum |w| dx / 2 (+ f32 rounding).
  const bool rounds = kiln::cpu::qmatmul_xwt_rounds_x(c.m);
  std::vector<double> xr(size_t(c.m * c.k)), half_step(xr.size(), 0.0);
  for (int64_t i = 0; i < c.m; ++i)
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
  std::vector<double> ref(size_t(c.m * c.n)), mag(ref.size()), ref_r(ref.size()), mag_r(ref.size()),
      extra(ref.size());
  for (int64_t i = 0; i < c.m; ++i)
    for (int64_t j = 0; j < c.n; ++j) {
      double s = 0, a = 0, sr = 0, ar = 0, e = 0;
      for (int64_t q = 0; q < c.k; ++q) {
        const size_t at = size_t(i * c.k + q);
        const double xv = x[size_t(i * ldx + q)], wv = w.deq[size_t(j * c.k + q)];
        s += xv * wv, sr += xr[at] * wv;
        a += std::abs(wv) * (std::abs(xv) + half_step[at]), ar += std::abs(wv * xr[at]);
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

void check_xw(const Case& c, uint32_t seed) {
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

std::vector<Case> cases() {
  std::vector<Case> out;
  for (DType f : {DType::q8_0, DType::q4_0})
    for (int64_t k : {32, 64, 576, 1536})
      for (int64_t m : {1, 3, 17, 512}) out.push_back({f, m, m == 512 ? 67 : 101, k});
  return out;
}

}  // namespace

TEST(QMatmul, XwtMatchesDequantizedProduct) {
  uint32_t seed = 1;
  for (const Case& c : cases()) check_xwt(c, seed++);
}

TEST(QMatmul, XwMatchesDequantizedProduct) {
  uint32_t seed = 100;
  for (const Case& c : cases()) check_xw(c, seed++);
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
}

// Odd block counts (the int8 path pairs blocks; an odd last one pairs with
// itself) inside and after a chunk of 16 blocks, for 1 to 4 rows of x.
TEST(QMatmul, OddBlockCounts) {
  uint32_t seed = 300;
  for (DType f : {DType::q8_0, DType::q4_0})
    for (int64_t k : {96, 544, 1120})
      for (int64_t m : {1, 2, 3, 4}) check_xwt({f, m, 13, k}, seed++);
}

// A non-finite x value makes the outputs that read it non-finite, on every path
// (the int8 path cannot round it: its block's outputs become NaN).
TEST(QMatmul, NonFiniteXPropagates) {
  for (DType f : {DType::q8_0, DType::q4_0})
    for (int64_t m : {1, 6}) {
      std::mt19937 rng(5);
      const QuantW w = random_w(f, 9, 64, 0, rng);
      std::vector<float> x = random_rows(m, 64, 64, rng);
      x[size_t(40)] = std::numeric_limits<float>::infinity();
      x[size_t((m - 1) * 64 + 3)] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> y(size_t(m * 9));
      ThreadCtx t;
      kiln::cpu::qmatmul_xwt(w.view(), x.data(), 64, y.data(), 9, m, t);
      for (int64_t j = 0; j < 9; ++j) {
        EXPECT_FALSE(std::isfinite(y[size_t(j)])) << "m=" << m << " j=" << j;
        EXPECT_TRUE(std::isnan(y[size_t((m - 1) * 9 + j)])) << "m=" << m << " j=" << j;
      }
      if (m > 1) {
        EXPECT_TRUE(std::isfinite(y[size_t(9)]));  // row 1 is finite
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
