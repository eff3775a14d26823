// Coverage of the op table by the cases: adding an op to ops.def without cases
// fails here. Also checks that the cases are well formed.
#include <gtest/gtest.h>

#include <cctype>
#include <set>

#include "ops/harness/check.h"

namespace kiln::test {
namespace {

struct Coverage {
  std::vector<std::vector<std::string>> eval_fwd, eval_any, grad;  // per op: case names
  std::vector<std::vector<std::string>> own_family;  // per op: cases of the op's family list
  std::vector<std::string> errors;                   // cases that failed to build
};

const Coverage& coverage() {
  static const Coverage cov = [] {
    Coverage c;
    const size_t n = size_t(Op::COUNT);
    c.eval_fwd.resize(n);
    c.eval_any.resize(n);
    c.grad.resize(n);
    c.own_family.resize(n);
    for (const Case& cs : all_cases()) {
      // The forward graph alone (what eval mode compares).
      Case fwd = cs;
      fwd.grad = false;
      const CaseOps f = case_ops(fwd);
      const CaseOps g = cs.grad ? case_ops(cs) : f;
      if (!f.error.empty()) c.errors.push_back(cs.name + ": " + f.error);
      if (!g.error.empty()) c.errors.push_back(cs.name + " (grad mode): " + g.error);
      for (size_t op = 0; op < n; ++op) {
        if (f.eval_ops[op]) c.eval_fwd[op].push_back(cs.name);
        if (f.eval_ops[op] || g.eval_ops[op]) c.eval_any[op].push_back(cs.name);
        if (cs.grad && cs.fd && g.grad_ops[op]) c.grad[op].push_back(cs.name);
        if ((f.eval_ops[op] || g.eval_ops[op]) && cs.family == op_family(Op(op)))
          c.own_family[op].push_back(cs.name);
      }
    }
    return c;
  }();
  return cov;
}

TEST(OpsCoverage, EveryCaseBuilds) {
  for (const std::string& e : coverage().errors) ADD_FAILURE() << e;
}

// Every op is computed by some case and compared with the reference. ALIAS ops
// (gradient accumulation) exist only in backward graphs, which grad mode runs on
// the CPU and compares; every other op needs a forward (eval-mode) case.
TEST(OpsCoverage, EveryOpHasAnEvalCase) {
  for (size_t op = 1; op < size_t(Op::COUNT); ++op) {
    const bool alias = op_kind(Op(op)) == OpKind::ALIAS;
    const auto& names = alias ? coverage().eval_any[op] : coverage().eval_fwd[op];
    EXPECT_FALSE(names.empty()) << "op " << op_name(Op(op))
                                << " has no eval case: add one in tests/ops/cases/";
  }
}

TEST(OpsCoverage, EveryDifferentiableOpHasAGradCase) {
  for (size_t op = 1; op < size_t(Op::COUNT); ++op) {
    if (!op_has_grad(Op(op))) continue;
    EXPECT_FALSE(coverage().grad[op].empty())
        << "op " << op_name(Op(op)) << " has a backward rule but no grad case exercises it";
  }
}

// Each op is tested by its own family's list (cases_<family>.cpp, named by the
// op's family in ops.def), so the cases of one op are found where its kernels
// and reference are (tests/ops/check_op_families.sh checks those files).
TEST(OpsCoverage, EveryOpHasACaseInItsFamilyFile) {
  for (size_t op = 1; op < size_t(Op::COUNT); ++op)
    EXPECT_FALSE(coverage().own_family[op].empty())
        << "op " << op_name(Op(op)) << " has no case in tests/ops/cases/cases_" << op_family(Op(op))
        << ".cpp";
}

// Every case list is an op family of ops.def (or the thread-count list).
TEST(OpsCoverage, CaseListsAreOpFamilies) {
  std::set<std::string> families;
  for (size_t op = 0; op < size_t(Op::COUNT); ++op) families.insert(op_family(Op(op)));
  for (const Case& c : all_cases())
    EXPECT_TRUE(c.family.empty() || families.count(c.family))
        << "case " << c.name << " is listed under '" << c.family << "', not a family of ops.def";
}

// The printed name is the enumerator in lower case (ops.def generates both).
TEST(OpsCoverage, PrintedNamesAreTheEnumerators) {
  EXPECT_STREQ(op_name(Op::LEAKY_RELU), "leaky_relu");
  EXPECT_STREQ(op_name(Op::EMBEDDING), "embedding");
  EXPECT_STREQ(op_name(Op::COPY), "copy");
  EXPECT_STREQ(op_name(Op::FULL), "full");
  EXPECT_STREQ(op_name(Op::ADAMW_STEP), "adamw_step");
  EXPECT_STREQ(op_family(Op::CONCAT), "index");
  std::set<std::string> names;
  for (size_t op = 0; op < size_t(Op::COUNT); ++op) {
    const std::string n = op_name(Op(op));
    EXPECT_TRUE(names.insert(n).second) << "duplicate op name " << n;
    for (char ch : n)
      EXPECT_TRUE(std::islower(static_cast<unsigned char>(ch)) ||
                  std::isdigit(static_cast<unsigned char>(ch)) || ch == '_')
          << n;
  }
}

// A case's declared ops must really appear in its graphs (catches stale cases
// and composites that stopped using an op without anyone noticing).
TEST(OpsCoverage, DeclaredOpsAppearInTheirCases) {
  for (const Case& c : all_cases()) {
    const CaseOps ops = case_ops(c);
    if (!ops.error.empty()) continue;  // reported by EveryCaseBuilds
    for (Op op : c.ops)
      EXPECT_TRUE(ops.eval_ops[size_t(op)])
          << "case " << c.name << " declares op " << op_name(op) << " but its graph has none";
  }
}

TEST(OpsCoverage, CaseNamesAreUniqueAndValid) {
  std::set<std::string> seen;
  for (const Case& c : all_cases()) {
    EXPECT_TRUE(seen.insert(c.name).second) << "duplicate case name " << c.name;
    for (char ch : c.name)
      EXPECT_TRUE(std::islower(static_cast<unsigned char>(ch)) ||
                  std::isdigit(static_cast<unsigned char>(ch)) || ch == '_')
          << "case name " << c.name;
    EXPECT_TRUE(c.build) << c.name;
    for (const Input& x : c.inputs) EXPECT_TRUE(x.gen) << c.name << " input " << x.name;
  }
}

// The perf sizes build too (perf mode is not run by ctest; building its graphs is cheap).
TEST(OpsCoverage, PerfSizedCasesBuild) {
  const std::vector<Case> big = make_cases(Sz{true});
  ASSERT_EQ(big.size(), all_cases().size());
  for (size_t i = 0; i < big.size(); ++i) {
    EXPECT_EQ(big[i].name, all_cases()[i].name);
    Context ctx;
    try {
      instantiate(big[i], ctx, big[i].grad);
    } catch (const std::exception& e) {
      ADD_FAILURE() << big[i].name << " at perf size: " << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::test
