// Errors found in the data at run time (ops.def: ONE_HOT / EMBEDDING range
// errors) throw kiln::Error naming the user-facing op, on every backend.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "ops/harness/check.h"

namespace kiln::test {
namespace {

// Runs out = build(ctx, leaf) with the leaf holding `values`; returns the error text.
template <class F>
std::string run_error(const BackendSpec& b, DType t, const Shape& s,
                      const std::vector<double>& values, F&& build) {
  Context ctx;
  Tensor x = ctx.input(t, s);
  Tensor out = build(ctx, x);
  Graph g = Graph::forward(out);
  auto be = b.make();
  auto buf = allocate_tensors(ctx, *be);
  upload(x, values);
  try {
    be->compute(g);
    be->synchronize();
  } catch (const kiln::Error& e) {
    return e.what();
  }
  return {};
}

// The checks of one backend; returns the number of failures (printed to stderr).
int range_error_checks(const BackendSpec& b) {
  int bad = 0;
  auto expect_prefix = [&](const std::string& e, const char* prefix) {
    if (e.rfind(prefix, 0) != 0) {
      std::fprintf(stderr, "expected an error starting with %s, got '%s'\n", prefix, e.c_str());
      ++bad;
    }
  };
  expect_prefix(
      run_error(b, DType::i32, {3}, {0, 4, 1}, [](Context&, Tensor l) { return one_hot(l, 4); }),
      "[one_hot]");
  expect_prefix(
      run_error(b, DType::i32, {3}, {0, -1, 1}, [](Context&, Tensor l) { return one_hot(l, 4); }),
      "[one_hot]");
  expect_prefix(run_error(b, DType::i32, {2}, {3, 7},
                          [](Context& ctx, Tensor l) {
                            return cross_entropy(zeros(ctx, {2, 5}), l);
                          }),
                "[cross_entropy]");
  // ignore_index skips -100 only: another label out of range is still an error,
  // and -100 is one when nothing is ignored.
  expect_prefix(
      run_error(b, DType::i32, {3}, {-100, 2, -1},
                [](Context& ctx, Tensor l) {
                  return cross_entropy(zeros(ctx, {3, 5}), l, {.ignore_index = kIgnoreIndex});
                }),
      "[cross_entropy] label -1 at position 2");
  expect_prefix(run_error(b, DType::i32, {2}, {1, -100},
                          [](Context& ctx, Tensor l) {
                            return cross_entropy(zeros(ctx, {2, 5}), l);
                          }),
                "[cross_entropy] label -100 at position 1");
  expect_prefix(run_error(b, DType::i32, {4}, {0, 1, 6, 2},
                          [](Context& ctx, Tensor i) {
                            return embedding(zeros(ctx, {6, 3}), i);
                          }),
                "[embedding]");
  // Many indices, one bad one in the middle: the kernel splits over threads and
  // only one thread finds the error (the others must not hang in a barrier).
  std::vector<double> idx(200000, 1.0);
  idx[123457] = 99;
  expect_prefix(run_error(b, DType::i32, {200000}, idx,
                          [](Context& ctx, Tensor i) {
                            return embedding(zeros(ctx, {6, 3}), i) * 2.0f;
                          }),
                "[embedding]");
  // In range: no error.
  const std::string ok = run_error(b, DType::i32, {4}, {0, 5, 5, 2}, [](Context& ctx, Tensor i) {
    return embedding(zeros(ctx, {6, 3}), i);
  });
  if (!ok.empty()) {
    std::fprintf(stderr, "unexpected error: %s\n", ok.c_str());
    ++bad;
  }
  return bad;
}

class OpsErrors : public ::testing::TestWithParam<size_t> {};

// In a child process with an alarm: a backend that deadlocks when one of its
// threads throws fails the test instead of hanging the suite.
TEST_P(OpsErrors, RangeErrorsNameTheOp) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const BackendSpec& b = test_backends()[GetParam()];
  EXPECT_EXIT(
      {
        alarm(10);
        const int bad = range_error_checks(b);
        std::fflush(stderr);
        std::_Exit(bad == 0 ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "")
      << "range errors on " << b.name << " (killed by signal 14 = SIGALRM: the run deadlocked)";
}

INSTANTIATE_TEST_SUITE_P(Backends, OpsErrors, ::testing::Range<size_t>(0, test_backends().size()),
                         [](const ::testing::TestParamInfo<size_t>& info) {
                           return test_backends()[info.param].name;
                         });

}  // namespace
}  // namespace kiln::test
