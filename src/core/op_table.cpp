// Tables generated from kiln/ops.def.
#include "core/autodiff.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {
struct OpInfo {
  const char* name;
  OpKind kind;
  bool inplace;
  bool grad;
};
constexpr OpInfo kOps[] = {
#define KILN_OP(e, name, kind, inplace, grad) {name, OpKind::kind, inplace != 0, grad != 0},
#include "kiln/ops.def"
#undef KILN_OP
};
static_assert(sizeof(kOps) / sizeof(kOps[0]) == size_t(Op::COUNT));
}  // namespace

const char* op_name(Op op) { return kOps[size_t(op)].name; }
OpKind op_kind(Op op) { return kOps[size_t(op)].kind; }
bool op_can_inplace(Op op) { return kOps[size_t(op)].inplace; }
bool op_has_grad(Op op) { return kOps[size_t(op)].grad; }

namespace detail {
namespace {
#define KILN_RULE_0(e) nullptr,
#define KILN_RULE_1(e) &backward_##e,
BackwardFn g_rules[] = {
#define KILN_OP(e, name, kind, inplace, grad) KILN_RULE_##grad(e)
#include "kiln/ops.def"
#undef KILN_OP
};
#undef KILN_RULE_0
#undef KILN_RULE_1
}  // namespace
BackwardFn& backward_rule(Op op) { return g_rules[size_t(op)]; }
}  // namespace detail

}  // namespace kiln
