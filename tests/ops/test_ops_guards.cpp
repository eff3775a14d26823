// The harness's memory checks: deliberately faulty kernels (one writes one element
// past its output, one changes its input) are caught, by the node-by-node eval
// run and by the whole-graph runs of the other modes.
#include <gtest/gtest.h>

#include <span>
#include <string>

#include "kiln/ext/tensor_node.h"
#include "ops/harness/check.h"

namespace kiln::test {
namespace {

enum class Fault { past_the_end, before_the_start, changes_input };

// The CPU backend, except that after each node of `op` it also does `fault`.
class FaultyCpu : public CpuBackend {
 public:
  FaultyCpu(Op op, Fault fault, int threads = 1) : CpuBackend(threads), op_(op), fault_(fault) {}
  using CpuBackend::compute;
  void compute(std::span<TensorNode* const> nodes) override {
    CpuBackend::compute(nodes);
    for (TensorNode* n : nodes) {
      if (n->op != op_) continue;
      auto* out = static_cast<float*>(n->data);
      switch (fault_) {
        case Fault::past_the_end: out[n->numel()] = 1.0f; break;
        case Fault::before_the_start: out[-1] = 1.0f; break;
        case Fault::changes_input: static_cast<float*>(n->src[0]->data)[0] += 1.0f; break;
      }
    }
  }

 private:
  Op op_;
  Fault fault_;
};

Case add_case() {
  return make_case(
      "guard_add", {Op::ADD}, {in("a", {3, 5}), in("b", {3, 5})},
      [](Context&, const std::vector<Tensor>& x) { return exp(x[0] + x[1]); }, false);
}

TEST(OpsGuards, CorrectKernelsPass) {
  const CheckResult r = check_eval(add_case());
  EXPECT_TRUE(r.ok) << r.msg;
}

TEST(OpsGuards, KernelWritingOnePastItsOutputIsCaught) {
  FaultyCpu be(Op::ADD, Fault::past_the_end);
  const CheckResult r = check_eval(add_case(), &be);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.msg.find("after node #"), std::string::npos) << r.msg;
  EXPECT_NE(r.msg.find("add [3, 5]"), std::string::npos) << r.msg;
  EXPECT_NE(r.msg.find("0 bytes past the end of"), std::string::npos) << r.msg;
}

TEST(OpsGuards, KernelWritingBeforeItsOutputIsCaught) {
  FaultyCpu be(Op::ADD, Fault::before_the_start);
  const CheckResult r = check_eval(add_case(), &be);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.msg.find("after node #"), std::string::npos) << r.msg;
  EXPECT_NE(r.msg.find("guard bytes overwritten"), std::string::npos) << r.msg;
}

TEST(OpsGuards, KernelChangingItsInputIsCaught) {
  FaultyCpu be(Op::ADD, Fault::changes_input);
  const CheckResult r = check_eval(add_case(), &be);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.msg.find("changed its source"), std::string::npos) << r.msg;
  EXPECT_NE(r.msg.find("'a'"), std::string::npos) << r.msg;
}

// The backend mode runs whole graphs (several threads); guards are checked after.
TEST(OpsGuards, BackendModeCatchesAWriteOutsideTheOutput) {
  const BackendSpec faulty{
      "faulty_cpu", [] { return std::make_unique<FaultyCpu>(Op::ADD, Fault::past_the_end, 2); }};
  const CheckResult r = check_backend(add_case(), faulty);
  ASSERT_FALSE(r.ok);
  EXPECT_NE(r.msg.find("past the end of"), std::string::npos) << r.msg;
}

}  // namespace
}  // namespace kiln::test
