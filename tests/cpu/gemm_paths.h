// What the GEMM path tests share (test_gemm_bias.cpp, test_gemm_bf16_out.cpp):
// random operands, running kiln::cpu::gemm on a standalone ThreadCtx
// (threads = 0) or on a pool of n threads, and checking that a case takes the
// path it is meant to test.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/thread_pool.h"
#include "kiln/dtype.h"

namespace kiln_test {

// A (M x K), B (K x N) and a bias (N) uniform in [-1, 1) (the bias times
// bias_scale), not exact in f32 sums, so the order of operations shows in the
// bits; a16 / b16 the same rounded to bf16. The generator, seeded by the
// shape, is left for the caller's further draws.
struct RandomOperands {
  std::mt19937 rng;
  std::vector<float> a32, b32, bias;
  std::vector<uint16_t> a16, b16;
};

inline RandomOperands random_operands(int64_t M, int64_t N, int64_t K, float bias_scale = 1.0f) {
  RandomOperands r{std::mt19937(uint32_t(M * 131 + N * 7 + K))};
  std::uniform_real_distribution<float> u(-1, 1);
  r.a32.resize(size_t(M * K)), r.b32.resize(size_t(K * N)), r.bias.resize(size_t(N));
  for (float& x : r.a32) x = u(r.rng);
  for (float& x : r.b32) x = u(r.rng);
  for (float& x : r.bias) x = u(r.rng) * bias_scale;
  for (float x : r.a32) r.a16.push_back(kiln::f32_to_bf16(x));
  for (float x : r.b32) r.b16.push_back(kiln::f32_to_bf16(x));
  return r;
}

inline void run_gemm(const kiln::cpu::GemmArgs& g, int threads) {
  if (threads == 0) {
    kiln::cpu::ThreadCtx t;
    kiln::cpu::gemm(g, t);
    return;
  }
  kiln::cpu::ThreadPool pool(threads);
  pool.run([&](kiln::cpu::ThreadCtx& t) { kiln::cpu::gemm(g, t); });
}

enum class GemmPath { blocked, small_m, small_n };

inline void expect_path(const kiln::cpu::GemmArgs& g, GemmPath path, const std::string& what) {
  namespace gd = kiln::cpu::gemm_detail;
  switch (path) {
    case GemmPath::small_m: EXPECT_TRUE(gd::small_m_applicable(g)) << what; break;
    case GemmPath::small_n:
      EXPECT_FALSE(gd::small_m_applicable(g)) << what;
      EXPECT_TRUE(gd::small_n_applicable(g)) << what;
      break;
    case GemmPath::blocked:
      EXPECT_FALSE(gd::small_m_applicable(g) || gd::small_n_applicable(g)) << what;
      break;
  }
}

}  // namespace kiln_test
