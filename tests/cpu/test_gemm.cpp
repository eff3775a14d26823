#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_convert.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/thread_pool.h"

using kiln::cpu::gemm;
using kiln::cpu::GemmArgs;
using kiln::cpu::GemmOperand;
using kiln::cpu::GemmType;
using kiln::cpu::ThreadCtx;
using kiln::cpu::ThreadPool;

namespace {

// f32 -> f16 / bf16 bits for values exactly representable in both (the test
// data are small multiples of 1/32).
uint16_t to_f16(float x) {
  if (x == 0) return std::signbit(x) ? 0x8000 : 0;
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int exp = int((u >> 23) & 0xff) - 127 + 15;
  return uint16_t(sign | uint32_t(exp) << 10 | ((u >> 13) & 0x3ffu));
}
uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return uint16_t(u >> 16);
}

// A rows x cols matrix of type `type`, stored with arbitrary strides inside a
// larger buffer: element (i, j) at data[off + i*rs + j*cs].
struct Mat {
  int64_t rows, cols;
  GemmType type;
  std::vector<float> vals;        // logical values, row-major
  std::vector<float> store32;     // storage for f32
  std::vector<uint16_t> store16;  // storage for f16 / bf16
  int64_t rs, cs, off;

  float at(int64_t i, int64_t j) const { return vals[i * cols + j]; }
  GemmOperand op() const {
    const void* base = type == GemmType::f32 ? static_cast<const void*>(store32.data() + off)
                                             : static_cast<const void*>(store16.data() + off);
    return {base, type, rs, cs};
  }
};

enum class Layout { row, col, strided };

Mat make_mat(int64_t rows, int64_t cols, GemmType type, Layout layout, std::mt19937& rng) {
  Mat m{rows, cols, type, {}, {}, {}, 0, 0, 0};
  std::uniform_int_distribution<int> d(-64, 64);
  m.vals.resize(rows * cols);
  for (auto& v : m.vals) v = float(d(rng)) / 32.0f;
  int64_t size;
  switch (layout) {
    case Layout::row:  // padded leading dimension
      m.rs = cols + 3, m.cs = 1, m.off = 0, size = rows * m.rs;
      break;
    case Layout::col:  // transposed view
      m.rs = 1, m.cs = rows + 1, m.off = 0, size = cols * m.cs;
      break;
    default:  // neither stride is 1; negative row stride
      m.cs = 2, m.rs = -(2 * cols + 1), m.off = (rows - 1) * (2 * cols + 1),
      size = m.off + 2 * cols;
      break;
  }
  size = std::max<int64_t>(size, 1);
  if (type == GemmType::f32) m.store32.assign(size, std::nanf(""));
  else m.store16.assign(size, 0x7e00);  // NaN in the gaps: must never be read
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t idx = m.off + i * m.rs + j * m.cs;
      const float v = m.at(i, j);
      if (type == GemmType::f32) m.store32[idx] = v;
      else m.store16[idx] = type == GemmType::f16 ? to_f16(v) : to_bf16(v);
    }
  return m;
}

void run_gemm(const GemmArgs& args, int threads) {
  if (threads == 0) {  // standalone context
    ThreadCtx t;
    gemm(args, t);
    return;
  }
  ThreadPool pool(threads);
  pool.run([&](ThreadCtx& t) { gemm(args, t); });
}

struct Case {
  int64_t M, N, K;
  GemmType ta = GemmType::f32, tb = GemmType::f32;
  Layout la = Layout::row, lb = Layout::row;
  bool accumulate = false;
};

std::string describe(const Case& c) {
  auto ts = [](GemmType t) {
    return t == GemmType::f32 ? "f32" : t == GemmType::f16 ? "f16" : "bf16";
  };
  auto ls = [](Layout l) {
    return l == Layout::row ? "row" : l == Layout::col ? "col" : "strided";
  };
  return std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " A " +
         ts(c.ta) + "/" + ls(c.la) + " B " + ts(c.tb) + "/" + ls(c.lb) +
         (c.accumulate ? " acc" : "");
}

// Checks gemm against a double-precision reference; returns C.
std::vector<float> check_case(const Case& c, int threads, uint32_t seed = 1) {
  std::mt19937 rng(seed);
  const Mat A = make_mat(c.M, c.K, c.ta, c.la, rng);
  const Mat B = make_mat(c.K, c.N, c.tb, c.lb, rng);
  const int64_t ldc = c.N + 5;
  std::vector<float> C(std::max<int64_t>(c.M * ldc, 1), std::nanf(""));
  std::vector<float> C0(C.size());
  std::uniform_real_distribution<float> u(-1, 1);
  if (c.accumulate)
    for (int64_t i = 0; i < c.M; ++i)
      for (int64_t j = 0; j < c.N; ++j) C[i * ldc + j] = u(rng);
  C0 = C;  // gaps stay NaN: must never be written

  GemmArgs args{c.M, c.N, c.K, A.op(), B.op(), C.data(), ldc, c.accumulate};
  run_gemm(args, threads);

  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = C[i * ldc + j];
      if (j >= c.N) {
        if (!std::isnan(got) && bad++ < 5)
          ADD_FAILURE() << describe(c) << ": wrote gap " << i << "," << j;
        continue;
      }
      double ref = c.accumulate ? C0[i * ldc + j] : 0.0, mag = std::fabs(ref);
      for (int64_t k = 0; k < c.K; ++k) {
        ref += double(A.at(i, k)) * B.at(k, j);
        mag += std::fabs(double(A.at(i, k)) * B.at(k, j));
      }
      const double tol = 1.2e-7 * (c.K + 2) * mag + 1e-30;
      if (!(std::fabs(got - ref) <= tol) && bad++ < 5)
        ADD_FAILURE() << describe(c) << " threads=" << threads << ": C(" << i << "," << j
                      << ") = " << got << ", expected " << ref;
    }
  }
  return C;
}

}  // namespace

TEST(Gemm, ShapesAndTranspositions) {
  const int64_t shapes[][3] = {{1, 1, 1},   {37, 53, 71}, {1, 100, 37},   {100, 1, 37},
                               {29, 31, 1}, {14, 32, 16}, {15, 33, 17},   {13, 31, 15},
                               {28, 64, 5}, {3, 2100, 9}, {170, 70, 300}, {5, 7, 600}};
  for (const auto& s : shapes)
    for (Layout la : {Layout::row, Layout::col})
      for (Layout lb : {Layout::row, Layout::col}) {
        Case c{s[0], s[1], s[2]};
        c.la = la, c.lb = lb;
        check_case(c, 2);
      }
}

TEST(Gemm, LargeIsh) {
  check_case({300, 500, 200}, 2);
  Case t{300, 500, 200};
  t.la = Layout::col, t.lb = Layout::col;
  check_case(t, 2);
}

TEST(Gemm, LongK) {
  // K large enough that B is packed in several column panels.
  const Case c{20, 130, 33000};
  const auto c1 = check_case(c, 1, 9);
  const auto c2 = check_case(c, 2, 9);
  EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0);
}

TEST(Gemm, GeneralStrides) {
  for (const auto& s :
       std::vector<std::array<int64_t, 3>>{{37, 53, 71}, {1, 40, 20}, {20, 1, 40}}) {
    Case c{s[0], s[1], s[2]};
    c.la = Layout::strided;
    check_case(c, 2);
    c.lb = Layout::strided;
    check_case(c, 2);
    c.la = Layout::row;
    check_case(c, 1);
  }
}

TEST(Gemm, HalfTypesAndMixed) {
  const GemmType types[] = {GemmType::f32, GemmType::f16, GemmType::bf16};
  for (GemmType ta : types)
    for (GemmType tb : types)
      for (Layout la : {Layout::row, Layout::col, Layout::strided})
        for (Layout lb : {Layout::row, Layout::col, Layout::strided}) {
          Case c{37, 53, 71, ta, tb, la, lb};
          check_case(c, 2);
        }
  check_case({33, 47, 300, GemmType::bf16, GemmType::f16, Layout::col, Layout::col}, 3);
}

TEST(Gemm, Accumulate) {
  for (Layout l : {Layout::row, Layout::col}) {
    check_case({37, 53, 71, GemmType::f32, GemmType::f32, l, l, true}, 2);
    check_case({1, 70, 600, GemmType::f32, GemmType::bf16, l, l, true}, 2);
    check_case({170, 40, 300, GemmType::f16, GemmType::f32, l, l, true}, 3);
  }
}

TEST(Gemm, FewRows) {
  // M <= 4 with row-major B takes the unpacked path; B transposed the packed one.
  const GemmType types[] = {GemmType::f32, GemmType::f16, GemmType::bf16};
  for (int64_t M = 1; M <= 5; ++M)
    for (GemmType tb : types)
      for (Layout lb : {Layout::row, Layout::col})
        for (bool acc : {false, true}) {
          Case c{M, 150, 67, GemmType::bf16, tb, Layout::col, lb, acc};
          const auto c1 = check_case(c, 1, 3);
          const auto c3 = check_case(c, 3, 3);
          EXPECT_EQ(std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)), 0) << describe(c);
        }
  check_case({1, 1000, 1000}, 2);
  check_case({3, 64, 1}, 2);
}

TEST(Gemm, FewRowsShortK) {
  // 5..16 rows with K <= 128 and row-major B: the unpacked path, rows in groups
  // of 4 (conv2d's per-image products); K = 129 is packed again.
  for (int64_t M : {5, 8, 13, 16, 17})
    for (int64_t K : {9, 72, 128, 129})
      for (bool acc : {false, true}) {
        Case c{M, 196, K, GemmType::f32, GemmType::f32, Layout::row, Layout::row, acc};
        const auto c1 = check_case(c, 1, 7);
        const auto c2 = check_case(c, 2, 7);
        EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0) << describe(c);
      }
}

TEST(Gemm, SmallOutputLongK) {
  // M*N <= 1536 with K >= 384 and row-major A: dot products in 4x4 blocks, B
  // columns read in place when B is a transposed f32 view (conv2d's weight
  // gradient), converted otherwise; ragged edges on both sides.
  for (const auto& s :
       std::vector<std::array<int64_t, 3>>{{16, 72, 400}, {8, 9, 784}, {5, 7, 384}, {3, 300, 500}})
    for (GemmType tb : {GemmType::f32, GemmType::bf16})
      for (Layout lb : {Layout::row, Layout::col})
        for (bool acc : {false, true}) {
          Case c{s[0], s[1], s[2], GemmType::f32, tb, Layout::row, lb, acc};
          const auto c1 = check_case(c, 1, 9);
          const auto c3 = check_case(c, 3, 9);
          EXPECT_EQ(std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)), 0) << describe(c);
        }
}

TEST(Gemm, FewColumns) {
  // N <= 4 with row-major A takes the dot-product path; A transposed the packed one.
  const GemmType types[] = {GemmType::f32, GemmType::f16, GemmType::bf16};
  for (int64_t N = 1; N <= 5; ++N)
    for (GemmType ta : types)
      for (Layout la : {Layout::row, Layout::col})
        for (bool acc : {false, true}) {
          Case c{150, N, 67, ta, GemmType::f16, la, Layout::col, acc};
          const auto c1 = check_case(c, 1, 5);
          const auto c3 = check_case(c, 3, 5);
          EXPECT_EQ(std::memcmp(c1.data(), c3.data(), c1.size() * sizeof(float)), 0) << describe(c);
        }
  check_case({1000, 1, 1000}, 2);
  check_case({7, 2, 15}, 2);
  check_case({7, 3, 16}, 2);
  check_case({9, 4, 17, GemmType::bf16, GemmType::f32, Layout::row, Layout::strided}, 2);
}

TEST(Gemm, ZeroSizes) {
  // K == 0: C = 0, or unchanged when accumulating.
  std::vector<float> C(6, 5.0f);
  float a = 1, b = 1;
  GemmArgs args{2, 3, 0, {&a, GemmType::f32, 0, 1}, {&b, GemmType::f32, 3, 1}, C.data(), 3};
  run_gemm(args, 2);
  for (float x : C) EXPECT_EQ(x, 0.0f);
  C.assign(6, 5.0f);
  args.accumulate = true;
  run_gemm(args, 2);
  for (float x : C) EXPECT_EQ(x, 5.0f);
  args.M = 0;  // nothing to do
  args.accumulate = false;
  run_gemm(args, 2);
  for (float x : C) EXPECT_EQ(x, 5.0f);
}

TEST(Gemm, StandaloneContext) { check_case({37, 53, 71}, 0); }

TEST(Gemm, BitIdenticalAcrossThreadCounts) {
  const Case cases[] = {
      {300, 500, 200},
      {37, 530, 710, GemmType::f32, GemmType::f32, Layout::col, Layout::row},
      {1, 900, 300, GemmType::f32, GemmType::f32, Layout::row, Layout::col},
      {500, 3, 300, GemmType::bf16, GemmType::f32, Layout::row, Layout::row, true},
      {129, 2100, 20},
  };
  for (const Case& c : cases) {
    const auto c1 = check_case(c, 1, 7);
    for (int threads : {2, 3, 4}) {
      const auto cn = check_case(c, threads, 7);
      ASSERT_EQ(c1.size(), cn.size());
      EXPECT_EQ(std::memcmp(c1.data(), cn.data(), c1.size() * sizeof(float)), 0)
          << describe(c) << " threads=" << threads;
    }
  }
}

TEST(Gemm, ManyProductsInOneRun) {
  // A graph's products run back to back in one pool run: B panels packed by
  // each thread for itself (small B, whose work counters alternate between
  // calls without a barrier), shared B panels, solo and unpacked products, in
  // turn. Each C must equal the same product run alone on one thread.
  const Case cases[] = {
      {300, 128, 128, GemmType::bf16, GemmType::bf16, Layout::row, Layout::col},  // private B
      {300, 130, 700, GemmType::f32, GemmType::f32, Layout::col, Layout::row},    // 450 KiB: shared
      {200, 1500, 600},  // B 3.6 MB packed: shared
      {40, 40, 40},      // solo
      {3, 300, 200},     // small M
      {130, 97, 250, GemmType::bf16, GemmType::bf16, Layout::col, Layout::row, true},  // private
      {14, 700, 301, GemmType::bf16, GemmType::bf16, Layout::col, Layout::row},  // 1 panel: shared
  };
  constexpr int kRounds = 7;
  struct Product {
    Mat A, B;
    std::vector<float> C, C1;
    GemmArgs args;
  };
  std::vector<Product> ps;
  std::mt19937 rng(5);
  for (int round = 0; round < kRounds; ++round)
    for (const Case& c : cases) {
      Product p{make_mat(c.M, c.K, c.ta, c.la, rng), make_mat(c.K, c.N, c.tb, c.lb, rng)};
      std::uniform_real_distribution<float> u(-1, 1);
      p.C.resize(size_t(c.M * c.N));
      for (float& x : p.C) x = u(rng);
      p.C1 = p.C;
      p.args = {c.M, c.N, c.K, p.A.op(), p.B.op(), nullptr, c.N, c.accumulate};
      ps.push_back(std::move(p));
    }
  for (Product& p : ps) {
    GemmArgs a = p.args;
    a.C = p.C1.data();
    run_gemm(a, 1);
  }
  for (int threads : {2, 3}) {
    std::vector<std::vector<float>> Cs;
    for (Product& p : ps) Cs.push_back(p.C);
    ThreadPool pool(threads);
    pool.run([&](ThreadCtx& t) {
      for (size_t i = 0; i < ps.size(); ++i) {
        GemmArgs a = ps[i].args;
        a.C = Cs[i].data();
        gemm(a, t);
      }
    });
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(std::memcmp(Cs[i].data(), ps[i].C1.data(), Cs[i].size() * sizeof(float)), 0)
          << describe(cases[i % std::size(cases)]) << " product " << i << " threads=" << threads;
  }
}

TEST(Gemm, AllF16AndBF16Values) {
  // Every 16-bit pattern through the packing conversions, including
  // subnormals, infinities and NaNs. Row-major: C = [1] x B (1 x 65536).
  // Transposed view: C = I16 x B with B 16 x 4096 (rs = 1, cs = 16); there
  // 0 * inf gives NaN, so infinities and NaNs are only checked row-major.
  std::vector<uint16_t> b(65536);
  for (int64_t j = 0; j < 65536; ++j) b[j] = uint16_t(j);
  std::vector<float> eye(16 * 16, 0.0f);
  for (int i = 0; i < 16; ++i) eye[i * 16 + i] = 1.0f;
  for (GemmType t : {GemmType::f16, GemmType::bf16}) {
    auto want = [&](uint16_t h) {
      return t == GemmType::f16 ? kiln::cpu::gemm_detail::f16_bits_to_f32(h)
                                : kiln::cpu::gemm_detail::bf16_bits_to_f32(h);
    };
    for (bool col : {false, true}) {
      const int64_t M = col ? 16 : 1, N = col ? 4096 : 65536, K = col ? 16 : 1;
      std::vector<float> C(M * N);
      GemmArgs args{M,
                    N,
                    K,
                    {eye.data(), GemmType::f32, 16, 1},
                    {b.data(), t, col ? 1 : N, col ? 16 : 1},
                    C.data(),
                    N};
      run_gemm(args, 2);
      int bad = 0;
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          const float w = want(uint16_t(col ? j * 16 + i : j)), got = C[i * N + j];
          if (!std::isfinite(w) && col) continue;
          const bool ok = std::isnan(w) ? std::isnan(got) : got == w;
          if (!ok && bad++ < 5)
            ADD_FAILURE() << (col ? "col " : "row ") << i << "," << j << ": " << got << " vs " << w;
        }
    }
  }
}

TEST(Gemm, ScalarF16Conversion) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    const double sign = (h & 0x8000) ? -1.0 : 1.0;
    const float got = kiln::cpu::gemm_detail::f16_bits_to_f32(uint16_t(h));
    if (e == 31) {
      if (m == 0) EXPECT_TRUE(std::isinf(got) && (got < 0) == (sign < 0)) << h;
      else EXPECT_TRUE(std::isnan(got)) << h;
    } else {
      const double want = e == 0 ? sign * std::ldexp(m, -24) : sign * std::ldexp(1024 + m, e - 25);
      ASSERT_EQ(double(got), want) << h;
      ASSERT_EQ(std::signbit(got), sign < 0) << h;
    }
  }
}

// bf16 x bf16 products: on AVX512_BF16 builds the blocked path packs k in pairs
// and runs vdpbf16ps (other builds convert to f32); the products are exact in
// f32 either way, so the double reference holds to f32 accumulation error.
TEST(Gemm, BF16PairsShapesAndLayouts) {
  // Odd and even K around the pair and block boundaries (KC_BF16 = 512), edge
  // tiles in M and N; none of these take the unpacked small-M / small-N paths.
  const int64_t shapes[][3] = {{17, 33, 1},   {17, 33, 2},   {29, 31, 3},    {14, 32, 16},
                               {15, 33, 17},  {13, 65, 63},  {28, 64, 5},    {37, 53, 71},
                               {20, 40, 511}, {20, 40, 513}, {43, 70, 1100}, {170, 70, 300}};
  const Layout layouts[] = {Layout::row, Layout::col, Layout::strided};
  for (const auto& s : shapes)
    for (Layout la : layouts)
      for (Layout lb : layouts) {
        Case c{s[0], s[1], s[2], GemmType::bf16, GemmType::bf16, la, lb};
        check_case(c, 2);
      }
}

TEST(Gemm, BF16PairsAccumulateAndThreads) {
  for (Layout l : {Layout::row, Layout::col})
    for (bool acc : {false, true}) {
      const Case c{129, 300, 777, GemmType::bf16, GemmType::bf16, l, l, acc};
      const auto c1 = check_case(c, 1, 11);
      for (int threads : {2, 3}) {
        const auto cn = check_case(c, threads, 11);
        EXPECT_EQ(std::memcmp(c1.data(), cn.data(), c1.size() * sizeof(float)), 0)
            << describe(c) << " threads=" << threads;
      }
    }
  check_case({300, 500, 200, GemmType::bf16, GemmType::bf16, Layout::row, Layout::col}, 0);
  // K long enough for 65 K blocks and B packed in two column panels.
  const Case lk{20, 130, 33000, GemmType::bf16, GemmType::bf16, Layout::row, Layout::col};
  const auto l1 = check_case(lk, 1, 9), l2 = check_case(lk, 2, 9);
  EXPECT_EQ(std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)), 0);
}

// Grids that split N (few rows, many columns: each thread packs the strips of
// B it computes) with the packing paths of both types: row-major B (pairs of
// rows interleaved), transposed A (pairs of columns), odd K, tails of M and N,
// and B in several column panels (long K). Same bits for any thread count.
TEST(Gemm, ColumnSplitGridsBitIdentical) {
  const Case cases[] = {
      {14, 700, 301, GemmType::bf16, GemmType::bf16, Layout::col, Layout::row},
      {13, 517, 64, GemmType::bf16, GemmType::bf16, Layout::row, Layout::row},
      {27, 1000, 77, GemmType::bf16, GemmType::bf16, Layout::col, Layout::col, true},
      {14, 130, 33001, GemmType::bf16, GemmType::bf16, Layout::col, Layout::row},
      {14, 700, 301, GemmType::f32, GemmType::f32, Layout::col, Layout::row},
      {6, 1100, 3000, GemmType::f32, GemmType::f32, Layout::row, Layout::row, true},
  };
  for (const Case& c : cases) {
    const auto c1 = check_case(c, 1, 3);
    for (int threads : {2, 3, 4}) {
      const auto cn = check_case(c, threads, 3);
      ASSERT_EQ(c1.size(), cn.size());
      EXPECT_EQ(std::memcmp(c1.data(), cn.data(), c1.size() * sizeof(float)), 0)
          << describe(c) << " threads=" << threads;
    }
  }
}

TEST(Gemm, BF16PairsAllValues) {
  // Every bf16 pattern times 1 through the blocked path (M = 17 rows of ones,
  // K = 1: the pair's second k is padding). Normal values, infinities and NaNs
  // come out as they went in; subnormals too, except that vdpbf16ps reads
  // subnormal inputs as zero.
  std::vector<uint16_t> b(65536), ones(17, to_bf16(1.0f));
  for (int64_t j = 0; j < 65536; ++j) b[j] = uint16_t(j);
  const int64_t M = 17, N = 65536;
  std::vector<float> C(M * N);
  GemmArgs args{
      M, N, 1, {ones.data(), GemmType::bf16, 1, 1}, {b.data(), GemmType::bf16, N, 1}, C.data(), N};
  run_gemm(args, 2);
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      const float w = kiln::cpu::gemm_detail::bf16_bits_to_f32(uint16_t(j)), got = C[i * N + j];
      const bool sub = w != 0 && std::fabs(w) < 1.17549435e-38f;
      const bool ok = std::isnan(w) ? std::isnan(got) : got == w || (sub && got == 0);
      if (!ok && bad++ < 5) ADD_FAILURE() << i << "," << j << ": " << got << " vs " << w;
    }
}

#if defined(KILN_GEMM_BF16)
// The pair-interleaved packed layouts of gemm_internal.h, element by element,
// for every packing branch (rows contiguous, columns contiguous, any strides),
// partial panels and strips, odd kc (zero partner) and offsets into the matrix.
TEST(Gemm, BF16PackLayouts) {
  using namespace kiln::cpu::gemm_detail;
  std::mt19937 rng(5);
  const uint16_t kJunk = 0xaaaa;
  for (Layout layout : {Layout::row, Layout::col, Layout::strided})
    for (int64_t kc : {1, 2, 31, 32, 33, 64, 65}) {
      const int64_t kc2 = round_up(kc, 2);
      for (int64_t mc : {1, 13, 14, 15, 29}) {  // A: mc x kc at (2, 3)
        const Mat A = make_mat(mc + 2, kc + 3, GemmType::bf16, layout, rng);
        std::vector<uint16_t> d(size_t(round_up(mc, MR) * kc2), kJunk);
        pack_a_bf16(A.op(), 2, 3, mc, kc, d.data());
        for (int64_t i = 0; i < round_up(mc, MR); ++i)
          for (int64_t k = 0; k < kc2; ++k) {
            const int64_t p = i / MR, r = i % MR;
            const uint16_t got = d[size_t(p * kc2 * MR + (k / 2) * 2 * MR + 2 * r + k % 2)];
            const uint16_t want = i < mc && k < kc ? to_bf16(A.at(2 + i, 3 + k)) : 0;
            ASSERT_EQ(got, want) << "A mc=" << mc << " kc=" << kc << " i=" << i << " k=" << k;
          }
      }
      for (int64_t nc : {1, 15, 16, 17, 32, 33, 70}) {  // B: kc x nc at (3, 2)
        const Mat B = make_mat(kc + 3, nc + 2, GemmType::bf16, layout, rng);
        const int64_t n_pad = round_up(nc, NR), bytes = round_up(n_pad * kc2 * 2, 64);
        std::unique_ptr<uint16_t, decltype(&std::free)> buf(
            static_cast<uint16_t*>(std::aligned_alloc(64, size_t(bytes))), &std::free);
        std::fill(buf.get(), buf.get() + n_pad * kc2, kJunk);
        pack_b_bf16(B.op(), 3, 2, kc, nc, buf.get());
        for (int64_t j = 0; j < n_pad; ++j)
          for (int64_t k = 0; k < kc2; ++k) {
            const int64_t s = j / NR, c = j % NR;
            const uint16_t got = buf.get()[s * kc2 * NR + (k / 2) * 2 * NR + 2 * c + k % 2];
            const uint16_t want = j < nc && k < kc ? to_bf16(B.at(3 + k, 2 + j)) : 0;
            ASSERT_EQ(got, want) << "B nc=" << nc << " kc=" << kc << " j=" << j << " k=" << k;
          }
      }
    }
}
#endif

// f32 operands read rounded to bf16 (GemmOperand::round_bf16, the casts that
// Graph::fold_bf16_casts folds into matmuls): the same bits as the product
// over bf16 copies of them (rounded alike, same layout), on every path and
// thread count; an f32 subnormal reads as zero.
namespace {

struct RoundedPair {
  std::vector<float> f32;      // the operand, in a strided layout
  std::vector<uint16_t> bf16;  // its bf16 copy, same layout
  GemmOperand rounded, copy;
};

RoundedPair rounded_pair(int64_t rows, int64_t cols, Layout layout, std::mt19937& rng) {
  const Mat shape = make_mat(rows, cols, GemmType::f32, layout, rng);
  RoundedPair p;
  p.f32.assign(shape.store32.size(), std::nanf(""));
  p.bf16.assign(shape.store32.size(), 0x7fc0);
  std::uniform_real_distribution<float> u(-2, 2);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t idx = shape.off + i * shape.rs + j * shape.cs;
      float v = u(rng);
      if ((i * 7 + j) % 97 == 3) v = 1e-39f;  // an f32 subnormal
      p.f32[size_t(idx)] = v;
      p.bf16[size_t(idx)] = kiln::cpu::gemm_detail::f32_to_bf16_daz(v);
    }
  p.rounded = {p.f32.data() + shape.off, GemmType::f32, shape.rs, shape.cs, true};
  p.copy = {p.bf16.data() + shape.off, GemmType::bf16, shape.rs, shape.cs};
  return p;
}

}  // namespace

TEST(Gemm, RoundedF32OperandsEqualBf16Copies) {
  EXPECT_EQ(kiln::cpu::gemm_detail::f32_to_bf16_daz(1e-39f), 0u);
  EXPECT_EQ(kiln::cpu::gemm_detail::f32_to_bf16_daz(-1e-39f), 0x8000u);
  EXPECT_EQ(kiln::cpu::gemm_detail::f32_to_bf16_daz(1.00390625f), 0x3f80u);  // tie to even
  EXPECT_EQ(kiln::cpu::gemm_detail::f32_to_bf16_daz(1.01171875f), 0x3f82u);  // tie to even, up
  const int64_t shapes[][3] = {{129, 300, 777}, {70, 90, 41}, {3, 150, 67},
                               {60, 3, 200},    {1, 40, 33},  {14, 32, 512}};
  const Layout layouts[] = {Layout::row, Layout::col, Layout::strided};
  std::mt19937 rng(7);
  for (const auto& s : shapes)
    for (Layout la : layouts)
      for (Layout lb : layouts)
        for (int which = 0; which < 3; ++which) {  // A rounded, B rounded, both
          const int64_t M = s[0], N = s[1], K = s[2], ldc = N + 1;
          RoundedPair a = rounded_pair(M, K, la, rng), b = rounded_pair(K, N, lb, rng);
          const GemmOperand ra = which != 1 ? a.rounded : a.copy;
          const GemmOperand rb = which != 0 ? b.rounded : b.copy;
          for (bool acc : {false, true})
            for (int threads : {0, 2, 3}) {
              std::vector<float> c1(size_t(M * ldc), 0.5f), c2 = c1;
              run_gemm({M, N, K, ra, rb, c1.data(), ldc, acc}, threads);
              run_gemm({M, N, K, a.copy, b.copy, c2.data(), ldc, acc}, threads);
              EXPECT_EQ(std::memcmp(c1.data(), c2.data(), c1.size() * sizeof(float)), 0)
                  << M << "x" << N << "x" << K << " layouts " << int(la) << "," << int(lb)
                  << " rounded " << which << " acc " << acc << " threads " << threads;
            }
        }
}

// The f32 path's packing (the SIMD fast paths of every instruction set and
// the portable code) reads a rounded operand as the widened bf16 copy, special
// values included: NaN (quieted), infinities, the largest finite f32 (rounds
// to infinity), subnormals (zero, signed) and ties.
TEST(Gemm, RoundedF32PackingEqualsPackingTheCopy) {
  using namespace kiln::cpu::gemm_detail;
  const float specials[] = {std::nanf(""), -std::nanf(""), bits_to_f32(0x7f800001u),
                            INFINITY,      -INFINITY,      3.4028235e38f,
                            -1e-39f,       -0.0f,          1.00390625f,
                            1.01171875f,   -65535.5f};
  std::mt19937 rng(5);
  for (Layout layout : {Layout::row, Layout::col, Layout::strided})
    for (int64_t kc : {1, 7, 8, 9, 16, 33})
      for (int64_t mn : {1, 5, 6, 7, 16, 17, 40}) {
        for (bool is_a : {true, false}) {
          const int64_t rows = is_a ? mn + 2 : kc + 3, cols = is_a ? kc + 3 : mn + 2;
          RoundedPair x = rounded_pair(rows, cols, layout, rng);
          auto* f = static_cast<float*>(const_cast<void*>(x.rounded.data));
          auto* h = static_cast<uint16_t*>(const_cast<void*>(x.copy.data));
          for (int64_t i = 0, n = 0; i < rows; ++i)
            for (int64_t j = (i * 3) % 4; j < cols; j += 4, ++n) {
              const float v = specials[size_t(n) % std::size(specials)];
              f[i * x.rounded.rs + j * x.rounded.cs] = v;
              h[i * x.copy.rs + j * x.copy.cs] = f32_to_bf16_daz(v);
            }
          const size_t n = size_t(round_up(mn, is_a ? MR : NR) * kc);
          std::vector<float> d1(n, 1.0f), d2(n, 2.0f);
          if (is_a) {
            pack_a(x.rounded, 2, 3, mn, kc, d1.data());
            pack_a(x.copy, 2, 3, mn, kc, d2.data());
          } else {
            pack_b(x.rounded, 3, 2, kc, mn, d1.data());
            pack_b(x.copy, 3, 2, kc, mn, d2.data());
          }
          EXPECT_EQ(std::memcmp(d1.data(), d2.data(), n * sizeof(float)), 0)
              << (is_a ? "A" : "B") << " layout " << int(layout) << " kc " << kc << " mn " << mn;
        }
      }
}

TEST(Gemm, RoundedPackingEqualsPackingTheCopy) {
#if defined(KILN_GEMM_BF16)
  using namespace kiln::cpu::gemm_detail;
  std::mt19937 rng(3);
  for (Layout layout : {Layout::row, Layout::col, Layout::strided})
    for (int64_t kc : {1, 2, 31, 32, 33, 64, 77})
      for (int64_t mn : {1, 5, 14, 16, 17, 40}) {
        RoundedPair a = rounded_pair(mn + 2, kc + 3, layout, rng);
        std::vector<uint16_t> d1(size_t(round_up(mn, MR) * round_up(kc, 2)), 1), d2 = d1;
        pack_a_bf16_round(a.rounded, 2, 3, mn, kc, d1.data());
        pack_a_bf16(a.copy, 2, 3, mn, kc, d2.data());
        EXPECT_EQ(d1, d2) << "A layout " << int(layout) << " kc " << kc << " mc " << mn;
        RoundedPair b = rounded_pair(kc + 3, mn + 2, layout, rng);
        const size_t n = size_t(round_up(mn, NR) * round_up(kc, 2));
        auto buf1 = std::unique_ptr<uint16_t[], decltype(&std::free)>(
            static_cast<uint16_t*>(std::aligned_alloc(64, n * 2 + 64)), &std::free);
        auto buf2 = std::unique_ptr<uint16_t[], decltype(&std::free)>(
            static_cast<uint16_t*>(std::aligned_alloc(64, n * 2 + 64)), &std::free);
        pack_b_bf16_round(b.rounded, 3, 2, kc, mn, buf1.get());
        pack_b_bf16(b.copy, 3, 2, kc, mn, buf2.get());
        EXPECT_EQ(std::memcmp(buf1.get(), buf2.get(), n * 2), 0)
            << "B layout " << int(layout) << " kc " << kc << " nc " << mn;
      }
#else
  GTEST_SKIP() << "no AVX512_BF16 packing in this build";
#endif
}
