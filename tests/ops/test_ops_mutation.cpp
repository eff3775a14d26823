// Mutation tests: the harness must FAIL when a backward rule is wrong in ways a
// single op case could hide (right shapes, wrong numbers), and when a composite's
// graph breaks its API promise. Each test swaps a rule-table entry for a wrong one
// and restores it afterwards.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autodiff.h"
#include "ops/harness/check.h"

namespace kiln::test {
namespace {

using kiln::detail::backward_rule;
using kiln::detail::BackwardFn;
using kiln::detail::GradCtx;

// Replaces an op's backward rule for the lifetime of the object.
class RuleSwap {
 public:
  RuleSwap(Op op, BackwardFn f) : op_(op), saved_(backward_rule(op)) { backward_rule(op) = f; }
  ~RuleSwap() { backward_rule(op_) = saved_; }
  RuleSwap(const RuleSwap&) = delete;
  RuleSwap& operator=(const RuleSwap&) = delete;

 private:
  Op op_;
  BackwardFn saved_;
};

// ADD that does not reduce broadcast dims: it takes the first slice of the
// gradient along each broadcast dim instead of summing (right shape, wrong values).
void add_first_slice_instead_of_sum(GradCtx& g) {
  for (int i = 0; i < 2; ++i) {
    if (!g.needs(i)) continue;
    Tensor gr = g.grad();
    const Tensor src = g.src(i);
    const int lead = gr.ndim() - src.ndim();
    for (int d = 0; d < gr.ndim(); ++d) {
      const bool bcast = d < lead || src.size(d - lead) == 1;
      if (bcast && gr.size(d) != 1) gr = gr.narrow(d, 0, 1);
    }
    g.add(i, gr.reshape(src.shape()));
  }
}

// MUL with its operands swapped: d/da = grad * a (should be grad * b).
void mul_swapped_operands(GradCtx& g) {
  const Tensor a = g.src(0), b = g.src(1);
  if (g.needs(0)) g.add(0, sum_to(g.grad() * a, a.shape()));
  if (g.needs(1)) g.add(1, sum_to(g.grad() * b, b.shape()));
}

// SOFTMAX without the "- sum(grad * y)" term: dx = grad * y * scale.
void softmax_missing_term(GradCtx& g) {
  if (g.needs(0)) g.add(0, g.grad() * g.out() * g.params<Op::SOFTMAX>().scale);
}

// MATMUL whose dB forgets to transpose A: dB = A' @ grad with A' a reshaped
// (not transposed) A. Only shapes with M == K make this the right shape.
void matmul_untransposed_a(GradCtx& g) {
  const Tensor a = g.src(0), b = g.src(1), gr = g.grad();
  if (g.needs(0)) g.add(0, matmul(gr, b.T()));
  if (g.needs(1)) g.add(1, matmul(a.contiguous().reshape({a.size(-1), a.size(-2)}), gr));
}

const Case& case_named(const std::string& name) {
  const Case* c = find_case(name);
  if (!c) throw std::runtime_error("no case " + name);
  return *c;
}

Case square_matmul_case() {
  Case c = case_named("matmul");
  c.name = "matmul_square";
  c.inputs[0].shape = {4, 4};
  c.inputs[1].shape = {4, 3};
  return c;
}

TEST(OpsMutation, AddWithoutBroadcastReductionFails) {
  const Case& c = case_named("add_bcast_row");
  ASSERT_TRUE(check_grad(c).ok) << "the unmutated case must pass first:\n" << check_grad(c).msg;
  {
    RuleSwap swap(Op::ADD, add_first_slice_instead_of_sum);
    const CheckResult r = check_grad(c);
    EXPECT_FALSE(r.ok) << "a non-reducing ADD rule went unnoticed";
    EXPECT_NE(r.msg.find("finite differences"), std::string::npos) << r.msg;
  }
  // Leading-dim broadcasting too.
  {
    RuleSwap swap(Op::ADD, add_first_slice_instead_of_sum);
    EXPECT_FALSE(check_grad(case_named("add_bcast_lead")).ok);
    EXPECT_FALSE(check_grad(case_named("add_bcast_outer")).ok);
  }
  EXPECT_TRUE(check_grad(c).ok) << "the rule was not restored";
}

TEST(OpsMutation, MulWithSwappedOperandsFails) {
  const Case& c = case_named("mul_same");
  ASSERT_TRUE(check_grad(c).ok) << check_grad(c).msg;
  {
    RuleSwap swap(Op::MUL, mul_swapped_operands);
    // The loss sum(out * R) itself uses MUL, so this also corrupts d/d out; the
    // point is only that the check notices.
    EXPECT_FALSE(check_grad(c).ok);
  }
  EXPECT_TRUE(check_grad(c).ok);
}

TEST(OpsMutation, SoftmaxMissingTermFails) {
  const Case& c = case_named("softmax_plain");
  ASSERT_TRUE(check_grad(c).ok) << check_grad(c).msg;
  {
    RuleSwap swap(Op::SOFTMAX, softmax_missing_term);
    EXPECT_FALSE(check_grad(c).ok);
  }
  EXPECT_TRUE(check_grad(c).ok);
}

TEST(OpsMutation, MatmulWrongTransposeFails) {
  const Case c = square_matmul_case();
  ASSERT_TRUE(check_grad(c).ok) << check_grad(c).msg;
  {
    RuleSwap swap(Op::MATMUL, matmul_untransposed_a);
    EXPECT_FALSE(check_grad(c).ok);
  }
  EXPECT_TRUE(check_grad(c).ok);
}

// A composite whose graph is fine op by op but breaks the API promise: the
// case's spec catches it (here: gelu's tanh form where erf was promised).
TEST(OpsMutation, SpecCatchesWrongComposite) {
  Case c = case_named("gelu_erf");
  c.build = [](Context&, const std::vector<Tensor>& x) { return gelu(x[0], GeluApprox::tanh); };
  const CheckResult r = check_eval(c);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.msg.find("spec"), std::string::npos) << r.msg;
}

// The comparisons themselves.
TEST(OpsMutation, CompareReportsTheWorstElement) {
  const RefValue want = ref_value({2, 2}, {1, 2, 3, 4});
  RefValue got = want;
  EXPECT_EQ(compare(want, got, Tol{}, "x"), "");
  got.v[2] += 1e-3;
  const std::string e = compare(want, got, Tol{}, "x");
  EXPECT_NE(e.find("[1, 0]"), std::string::npos) << e;
  got.v[2] = std::nan("");
  EXPECT_NE(compare(want, got, Tol{}, "x"), "");
  EXPECT_NE(compare_exact(want, got, "x"), "");
  got = want;
  got.v[3] = std::nextafter(4.0, 5.0);
  EXPECT_NE(compare_exact(want, got, "x"), "");
}

}  // namespace
}  // namespace kiln::test
