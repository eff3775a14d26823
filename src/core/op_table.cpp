// Tables generated from kiln/ops.def.
#include <array>
#include <cctype>
#include <string>

#include "core/autodiff.h"
#include "kiln/tensor.h"

namespace kiln {

namespace {
struct OpInfo {
  const char* enumerator;
  const char* family;
  OpKind kind;
  bool inplace;
  bool grad;
};
constexpr OpInfo kOps[] = {
#define KILN_OP(e, family, kind, inplace, grad) \
  {#e, #family, OpKind::kind, inplace != 0, grad != 0},
#include "kiln/ops.def"
#undef KILN_OP
};
constexpr size_t kCount = size_t(Op::COUNT);
static_assert(sizeof(kOps) / sizeof(kOps[0]) == kCount);

// The printed names: each enumerator in lower case, made once.
struct Names {
  std::array<std::string, kCount> s;
  Names() {
    for (size_t i = 0; i < kCount; ++i)
      for (const char* c = kOps[i].enumerator; *c; ++c)
        s[i] += char(std::tolower(static_cast<unsigned char>(*c)));
  }
};
}  // namespace

const char* op_name(Op op) {
  static const Names names;
  return names.s[size_t(op)].c_str();
}
const char* op_family(Op op) { return kOps[size_t(op)].family; }
OpKind op_kind(Op op) { return kOps[size_t(op)].kind; }
bool op_can_inplace(Op op) { return kOps[size_t(op)].inplace; }
bool op_has_grad(Op op) { return kOps[size_t(op)].grad; }

namespace detail {
namespace {
#define KILN_RULE_0(e) nullptr,
#define KILN_RULE_1(e) &backward_##e,
BackwardFn g_rules[] = {
#define KILN_OP(e, family, kind, inplace, grad) KILN_RULE_##grad(e)
#include "kiln/ops.def"
#undef KILN_OP
};
#undef KILN_RULE_0
#undef KILN_RULE_1
}  // namespace
BackwardFn& backward_rule(Op op) { return g_rules[size_t(op)]; }
}  // namespace detail

}  // namespace kiln
