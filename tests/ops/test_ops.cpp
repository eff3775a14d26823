// The op-test harness (kiln_test_ops): one gtest test per case and mode.
//
//   OpsEval/<case>           the case on CpuBackend(1 thread) vs the double-precision
//                            reference (tests/ops/reference), plus the case's spec
//   OpsGrad/<case>           finite differences vs the backward graph (double), the
//                            CPU's f32 gradients vs that, accumulation/reset_grads
//   OpsBackends/<case>       every other backend of test_backends() vs CpuBackend(1);
//                            the CPU with 2 and 3 threads must be bit-identical
//   OpsCoverage.*            every op has eval cases; every differentiable op grad cases
//   OpsMutation.*            a wrong backward rule makes the grad check fail
//   OpsReference.*           hand-computed checks of the reference itself
//
// KILN_OPS_VERBOSE=1 prints each comparison's worst error as a multiple of its
// bound (how close a case is to its tolerance).
//
// Run:   build/<dir>/tests/kiln_test_ops [--gtest_filter='OpsEval/*matmul*']
// Perf:  build/<dir>/tests/kiln_ops_perf [filter] [--reps N]   (see perf/perf_main.cpp)
// Cases: tests/ops/cases/*.cpp (add an op = add a case there).
#include <gtest/gtest.h>

#include <iostream>

#include "ops/harness/check.h"

namespace kiln::test {
namespace {

std::vector<size_t> case_indices(bool grad_only) {
  std::vector<size_t> r;
  for (size_t i = 0; i < all_cases().size(); ++i)
    if (!grad_only || all_cases()[i].grad) r.push_back(i);
  return r;
}

std::string case_param_name(const ::testing::TestParamInfo<size_t>& info) {
  return all_cases()[info.param].name;
}

class OpsEval : public ::testing::TestWithParam<size_t> {};

TEST_P(OpsEval, MatchesReference) {
  const Case& c = all_cases()[GetParam()];
  const CheckResult r = check_eval(c);
  EXPECT_TRUE(r.ok) << "case " << c.name << ":\n" << r.msg;
  if (!r.notes.empty()) std::cout << r.notes;
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsEval, ::testing::ValuesIn(case_indices(false)), case_param_name);

class OpsGrad : public ::testing::TestWithParam<size_t> {};

TEST_P(OpsGrad, MatchesFiniteDifferences) {
  const Case& c = all_cases()[GetParam()];
  const CheckResult r = check_grad(c);
  EXPECT_TRUE(r.ok) << "case " << c.name << ":\n" << r.msg;
  if (!r.notes.empty()) std::cout << r.notes;
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsGrad, ::testing::ValuesIn(case_indices(true)), case_param_name);

// Every backend after the baseline (entry 0) vs the baseline, in one test per
// case (a test per backend would double the processes ctest starts).
class OpsBackends : public ::testing::TestWithParam<size_t> {};

TEST_P(OpsBackends, MatchesCpu) {
  const Case& c = all_cases()[GetParam()];
  for (size_t b = 1; b < test_backends().size(); ++b) {
    const CheckResult r = check_backend(c, test_backends()[b]);
    EXPECT_TRUE(r.ok) << "case " << c.name << " on " << test_backends()[b].name << ":\n" << r.msg;
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, OpsBackends, ::testing::ValuesIn(case_indices(false)),
                         case_param_name);

}  // namespace
}  // namespace kiln::test
