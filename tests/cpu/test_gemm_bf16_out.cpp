// GemmArgs::C_bf16: a GEMM storing bf16 must give, bit for bit, the f32 GEMM's C
// rounded by kiln::f32_to_bf16 (what a COPY to bf16 does), on every path of
// kiln::cpu::gemm (blocked f32 and bf16, one or several K blocks, operands read
// rounded, small_m, small_n, solo, K = 0), with and without a bias, for any
// thread count; the gaps between C's rows stay untouched.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "cpu/gemm_paths.h"
#include "kiln/dtype.h"

namespace {

using kiln::cpu::GemmArgs;
using kiln::cpu::GemmOperand;
using kiln::cpu::GemmType;

enum class Operands { f32, bf16, f32_rounded };
using Path = kiln_test::GemmPath;

struct Bf16OutCase {
  int64_t M, N, K;
  Operands ops = Operands::f32;
  bool bias = false;
  Path path = Path::blocked;
  bool b_trans = true;  // B a W.T() view (rs = 1); small_m needs row-contiguous B
};

std::string describe_bf16_out(const Bf16OutCase& c, int threads) {
  const char* ops[] = {"f32", "bf16", "f32 read rounded"};
  return std::to_string(c.M) + "x" + std::to_string(c.N) + "x" + std::to_string(c.K) + " " +
         ops[int(c.ops)] + (c.bias ? " bias" : "") + " threads=" + std::to_string(threads);
}

constexpr uint16_t kGap = 0xABCD;  // between C's rows: must stay

// C computed as bf16 by the GEMM, and in `want` the f32 GEMM's C rounded.
std::vector<uint16_t> bf16_out(const Bf16OutCase& c, int threads, std::vector<uint16_t>& want) {
  // (A bias large enough to change the rounding.)
  const auto [rng, a32, b32, bias, a16, b16] = kiln_test::random_operands(c.M, c.N, c.K, 100.0f);
  const bool bf = c.ops == Operands::bf16, rounded = c.ops == Operands::f32_rounded;
  const GemmType t = bf ? GemmType::bf16 : GemmType::f32;
  GemmArgs g{};
  g.M = c.M, g.N = c.N, g.K = c.K;
  g.A = {bf ? static_cast<const void*>(a16.data()) : a32.data(), t, c.K, 1, rounded};
  const void* bp = bf ? static_cast<const void*>(b16.data()) : b32.data();
  g.B = c.b_trans ? GemmOperand{bp, t, 1, c.K, rounded} : GemmOperand{bp, t, c.N, 1, rounded};
  g.bias = c.bias ? bias.data() : nullptr;
  kiln_test::expect_path(g, c.path, describe_bf16_out(c, threads));  // the path it is meant to test
  const int64_t ldc = c.N + 3;
  std::vector<float> c32(size_t(c.M * c.N));
  g.C = c32.data(), g.ldc = c.N;
  kiln_test::run_gemm(g, threads);
  want.assign(size_t(c.M * ldc), kGap);
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j)
      want[size_t(i * ldc + j)] = kiln::f32_to_bf16(c32[size_t(i * c.N + j)]);
  std::vector<uint16_t> got(size_t(c.M * ldc), kGap);
  g.C = nullptr, g.C_bf16 = got.data(), g.ldc = ldc;
  kiln_test::run_gemm(g, threads);
  return got;
}

void check_bf16_out(const Bf16OutCase& c) {
  std::vector<uint16_t> ref1;
  const std::vector<uint16_t> got1 = bf16_out(c, 1, ref1);
  EXPECT_EQ(got1, ref1) << describe_bf16_out(c, 1);
  for (int threads : {0, 2, 3}) {
    std::vector<uint16_t> ref;
    const std::vector<uint16_t> got = bf16_out(c, threads, ref);
    EXPECT_EQ(got, ref) << describe_bf16_out(c, threads);
    EXPECT_EQ(got, got1) << describe_bf16_out(c, threads) << " vs 1 thread";
  }
}

TEST(GemmBf16Out, Blocked) {
  for (Operands ops : {Operands::f32, Operands::bf16, Operands::f32_rounded})
    for (bool bias : {false, true}) {
      check_bf16_out({77, 150, 100, ops, bias});   // one K block, edge tiles in M and N
      check_bf16_out({300, 128, 600, ops, bias});  // several K blocks (f32; one or two in bf16)
      check_bf16_out({20, 100, 1100, ops, bias});  // many K blocks, few rows
      check_bf16_out({40, 700, 300, ops, bias});   // wide: threads split N
      check_bf16_out({30, 40, 200, ops, bias});    // small enough to run solo
    }
}

TEST(GemmBf16Out, SmallPaths) {
  for (Operands ops : {Operands::f32, Operands::bf16, Operands::f32_rounded})
    for (bool bias : {false, true}) {
      check_bf16_out({3, 70, 30, ops, bias, Path::small_m, false});
      check_bf16_out({50, 3, 70, ops, bias, Path::small_n});
    }
}

TEST(GemmBf16Out, ZeroK) {
  // K = 0: C = bias, rounded (0 without one).
  std::vector<uint16_t> C(6, kGap);
  std::vector<float> bias = {0.5f, -1.00390625f, 3.14159f};
  float dummy = 0;
  GemmArgs g{};
  g.M = 2, g.N = 3, g.K = 0;
  g.A = {&dummy, GemmType::f32, 0, 1};
  g.B = {&dummy, GemmType::f32, 3, 1};
  g.C_bf16 = C.data(), g.ldc = 3, g.bias = bias.data();
  kiln_test::run_gemm(g, 2);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(C[size_t(i)], kiln::f32_to_bf16(bias[size_t(i % 3)])) << i;
}

}  // namespace
