// Internal to the harness: one case instantiated in its own Context, optionally
// with the grad-mode loss sum(out * R) and its backward pass, ready to run on a
// backend.
#pragma once
#include <memory>
#include <vector>

#include "ops/harness/check.h"
#include "ops/harness/guard.h"

namespace kiln::test {

struct Session {
  Session(const Case& c, bool grad_mode);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Gives every tensor memory on `be` (with guard bytes around each tensor when
  // be's memory is host memory) and uploads the case's values (and R).
  void allocate(Backend& be);
  // Runs the graph; throws RefError when a kernel wrote over a guard.
  void run(Backend& be);
  // Runs the graph node by node, checking guards and that no node but an ALIAS
  // one changed its sources; "" or what went wrong.
  std::string run_checked(Backend& be);
  // The reference's starting values: every input leaf (and R).
  RefValues leaf_values() const;

  const Case& c;
  bool grad_mode;
  Context ctx;
  Built b;
  std::vector<std::vector<double>> values;  // per input, stored layout
  Tensor R, loss;                           // grad mode only
  // R's values: random, but 0 where the reference output is +-inf (a masked
  // entry: a constant, so it takes no part in the loss the gradients are of).
  std::vector<double> r_values;
  std::vector<size_t> params;  // grad mode: indices of inputs that are params
  Graph g;
  std::unique_ptr<Buffer> buf;
  bool guarded = false;  // buf came from `mem`
  GuardedMemory mem;
};

// Gives leaves that the caller did not give a value a value: zero for gradient
// accumulators, the backend's data for leaves that have memory; else RefError.
void fill_leaves(const Graph& g, RefValues& vals);

// Runs a check body, turning exceptions (kiln::Error from the library, RefError
// from the reference) into a failed CheckResult.
template <class F>
CheckResult guarded(F&& f) {
  CheckResult r;
  try {
    f(r);
  } catch (const kiln::Error& e) {
    r.fail(std::string("kiln::Error: ") + e.what());
  } catch (const RefError& e) {
    r.fail(std::string("reference: ") + e.what());
  } catch (const std::exception& e) {
    r.fail(std::string("exception: ") + e.what());
  }
  return r;
}

}  // namespace kiln::test
