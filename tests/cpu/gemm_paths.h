// What the GEMM path tests share (test_gemm_bias.cpp, test_gemm_bf16_out.cpp):
// running kiln::cpu::gemm on a standalone ThreadCtx (threads = 0) or on a pool
// of n threads, and checking that a case takes the path it is meant to test.
#pragma once
#include <gtest/gtest.h>

#include <string>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/thread_pool.h"

namespace kiln_test {

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
