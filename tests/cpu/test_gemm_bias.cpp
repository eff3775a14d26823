// GemmArgs::bias: C = (A@B [+ C]) + bias must be bit-identical to the GEMM
// without a bias followed by a separate add of the bias row, in every path of
// kiln::cpu::gemm (blocked f32 and bf16, one or several K blocks, small_m,
// small_n and its dot-product case, solo, K = 0), accumulating or not, for any
// thread count; the gaps between C's rows stay untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "cpu/gemm_paths.h"

namespace {

using kiln::cpu::GemmArgs;
using kiln::cpu::GemmType;

using Path = kiln_test::GemmPath;

struct BiasCase {
  int64_t M, N, K;
  bool bf16 = false;     // A and B bf16 (else f32)
  bool b_trans = false;  // B a transposed view (rs = 1), as a Linear's W.T()
  bool accumulate = false;
  Path path = Path::blocked;
};

std::string describe_bias(const BiasCase& c, int threads) {
  return std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) +
         (c.bf16 ? " bf16" : " f32") + (c.b_trans ? " B^T" : "") + (c.accumulate ? " acc" : "") +
         " threads=" + std::to_string(threads);
}

// Random operands (kiln_test::random_operands); returns C computed with the
// bias in the GEMM and, in `want`, C computed without it and the bias added
// afterwards.
std::vector<float> with_bias(const BiasCase& c, int threads, std::vector<float>& want) {
  auto [rng, a32, b32, bias, a16, b16] = kiln_test::random_operands(c.M, c.N, c.K);
  std::uniform_real_distribution<float> u(-1, 1);
  const GemmType t = c.bf16 ? GemmType::bf16 : GemmType::f32;
  const void* ap = c.bf16 ? static_cast<const void*>(a16.data()) : a32.data();
  const void* bp = c.bf16 ? static_cast<const void*>(b16.data()) : b32.data();
  const int64_t ldc = c.N + 3;
  std::vector<float> C0(size_t(c.M * ldc), std::nanf(""));  // NaN gaps: never written
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) C0[size_t(i * ldc + j)] = c.accumulate ? u(rng) : 0.0f;
  GemmArgs g{};
  g.M = c.M, g.N = c.N, g.K = c.K;
  g.A = {ap, t, c.K, 1};
  // B^T: the K x N view of an N x K matrix (same values, another layout).
  g.B = c.b_trans ? kiln::cpu::GemmOperand{bp, t, 1, c.K} : kiln::cpu::GemmOperand{bp, t, c.N, 1};
  g.ldc = ldc;
  g.accumulate = c.accumulate;
  kiln_test::expect_path(g, c.path, describe_bias(c, threads));  // the path it is meant to test
  want = C0;
  g.C = want.data();
  kiln_test::run_gemm(g, threads);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) want[size_t(i * ldc + j)] += bias[size_t(j)];
  std::vector<float> got = C0;
  g.C = got.data();
  g.bias = bias.data();
  kiln_test::run_gemm(g, threads);
  return got;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void check_bias(const BiasCase& c) {
  std::vector<float> ref1;
  const std::vector<float> got1 = with_bias(c, 1, ref1);
  EXPECT_TRUE(same_bits(got1, ref1)) << describe_bias(c, 1);
  for (int threads : {0, 2, 3}) {
    std::vector<float> ref;
    const std::vector<float> got = with_bias(c, threads, ref);
    EXPECT_TRUE(same_bits(got, ref)) << describe_bias(c, threads);
    EXPECT_TRUE(same_bits(got, got1)) << describe_bias(c, threads) << " vs 1 thread";
  }
}

TEST(GemmBias, BlockedOneAndSeveralKBlocks) {
  // K <= KC: one K block (the bias after the only kernel call of each tile);
  // K > KC: several, each tile's K blocks back to back (A packed for all of K).
  for (bool acc : {false, true})
    for (bool bt : {false, true}) {
      check_bias({77, 150, 100, false, bt, acc});   // edge tiles in M and N
      check_bias({300, 128, 600, false, bt, acc});  // 3 K blocks, 2+ threads split M
      check_bias({40, 700, 300, false, bt, acc});   // wide: threads split N
      check_bias({20, 100, 1100, false, bt, acc});  // 5 K blocks, few rows
      check_bias({30, 40, 200, false, bt, acc});    // small enough to run solo
    }
}

TEST(GemmBias, BlockedBf16) {
  for (bool acc : {false, true}) {
    check_bias({77, 150, 100, true, true, acc});
    check_bias({130, 96, 1100, true, true, acc});  // K > KC_BF16: several K blocks
    check_bias({64, 384, 128, true, true, acc});   // a GPT layer's shape, scaled down
  }
}

TEST(GemmBias, SmallM) {
  for (bool acc : {false, true}) {
    check_bias({1, 200, 50, false, false, acc, Path::small_m});
    check_bias({3, 70, 30, true, false, acc, Path::small_m});
    check_bias({6, 130, 64, false, false, acc, Path::small_m});  // short K: up to 16 rows
  }
}

TEST(GemmBias, SmallN) {
  for (bool acc : {false, true}) {
    check_bias({50, 1, 40, false, false, acc, Path::small_n});
    check_bias({33, 3, 70, true, true, acc, Path::small_n});
    check_bias({30, 7, 500, false, true, acc, Path::small_n});  // small C, long K: dot products
  }
}

TEST(GemmBias, ZeroK) {
  // K = 0: C = bias (or C + bias when accumulating).
  for (bool acc : {false, true}) {
    std::vector<float> C = {1, 2, 3, 4, 5, 6}, bias = {0.5f, -1, 2};
    float dummy = 0;
    GemmArgs g{};
    g.M = 2, g.N = 3, g.K = 0;
    g.A = {&dummy, GemmType::f32, 0, 1};
    g.B = {&dummy, GemmType::f32, 3, 1};
    g.C = C.data(), g.ldc = 3, g.accumulate = acc, g.bias = bias.data();
    kiln_test::run_gemm(g, 2);
    for (int i = 0; i < 6; ++i)
      EXPECT_EQ(C[size_t(i)], (acc ? float(i + 1) : 0.0f) + bias[size_t(i % 3)]) << i;
  }
}

}  // namespace
