// The op-test harness's checks. Each returns a CheckResult instead of raising
// gtest failures, so tests can also assert that a check FAILS (mutation tests).
//
//   eval:    the case on CpuBackend(1 thread) vs the double reference (+ spec),
//            run node by node: no kernel may write outside its output (guard
//            bytes around every tensor) or change its sources (unless ALIAS)
//   backend: the case on another backend vs CpuBackend(1 thread) (forward, and
//            forward+backward for grad cases); bit-identical where the backend
//            promises it (the CPU backend with another thread count)
//   grad:    (a) the library's backward graph evaluated by the double reference
//            vs central finite differences of the double reference forward, for
//            every element of every param; (b) the same graph on CpuBackend in
//            f32 vs (a); (c) gradients accumulate over runs and reset_grads()
//            zeroes them
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/harness/case.h"

namespace kiln::test {

struct CheckResult {
  bool ok = true;
  std::string msg;    // what failed (empty when ok)
  std::string notes;  // KILN_OPS_VERBOSE=1: worst error / bound of each comparison
  void fail(const std::string& m) {
    ok = false;
    msg += (msg.empty() ? "" : "\n") + m;
  }
};

// A backend to compare with the CPU backend. Entry 0 of test_backends() is the
// baseline, CpuBackend with 1 thread. Adding a backend (BLAS, CUDA) is one entry.
struct BackendSpec {
  std::string name;  // [A-Za-z0-9_]
  std::function<std::unique_ptr<Backend>()> make;
  bool bitwise = false;    // results must equal the baseline's bit for bit
  double tol_scale = 1.0;  // else: the case's tolerances times this
};
const std::vector<BackendSpec>& test_backends();

// A case instantiated in a context.
struct Built {
  std::vector<Tensor> leaves;  // one per Input: the stored tensor
  std::vector<Tensor> views;   // one per Input: what the build function got
  Tensor out;
};
// as_params: f32 inputs with diff=true become ctx.param (grad mode).
Built instantiate(const Case& c, Context& ctx, bool as_params);
// The stored values of each input (deterministic per case and input), already
// rounded to the input's dtype.
std::vector<std::vector<double>> case_values(const Case& c);
// Writes values into a tensor (converted to its dtype) / reads one back as double.
void upload(Tensor t, const std::vector<double>& v);
RefValue download(Tensor t);

// Compares got with ref; "" when every element is within tol, else a report
// naming the worst element.
// `worst`, when given, receives the largest error / bound ratio (<= 1 passes).
std::string compare(const RefValue& ref, const RefValue& got, const Tol& tol,
                    const std::string& what, double* worst = nullptr);
// True when KILN_OPS_VERBOSE is set (checks then fill CheckResult::notes).
bool verbose();
// Bit-for-bit equality (as stored values); "" when equal.
std::string compare_exact(const RefValue& want, const RefValue& got, const std::string& what);

// be: what runs the case (default CpuBackend with 1 thread); tests pass a
// deliberately faulty backend to show that the harness catches it.
CheckResult check_eval(const Case& c, Backend* be = nullptr);
CheckResult check_backend(const Case& c, const BackendSpec& b);
CheckResult check_grad(const Case& c);

// Ops present in the case's graphs: the forward graph and, for grad cases, the
// nodes whose backward rule ran (in `grad_ops`) plus every op of the backward graph
// (in `eval_ops`, since grad mode evaluates it on the CPU against the reference).
struct CaseOps {
  std::vector<bool> eval_ops = std::vector<bool>(size_t(Op::COUNT), false);
  std::vector<bool> grad_ops = std::vector<bool>(size_t(Op::COUNT), false);
  std::string error;  // building the case threw
};
CaseOps case_ops(const Case& c);

// Perf mode: median wall time per graph run of each case on each backend.
struct PerfOptions {
  std::string filter;  // substring of case names; empty: all
  int reps = 20;
  bool big = true;  // the cases' perf sizes
};
void run_perf(const PerfOptions& opt, std::ostream& os);

}  // namespace kiln::test
