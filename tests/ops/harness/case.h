// Op-test cases: each case names the ops it covers, describes its inputs (shape,
// dtype, value generator, memory layout), builds its output with the public API,
// and states its tolerances. The harness (harness/check.h) runs every case in
// eval mode and, when `grad` is set, in grad mode; perf mode reruns the cases at
// their large sizes (Sz).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "ops/reference/reference.h"

namespace kiln::test {

// Deterministic RNG for input values (splitmix64), identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  double uniform();                         // [0, 1)
  double uniform(double lo, double hi);     // [lo, hi)
  int64_t integer(int64_t lo, int64_t hi);  // [lo, hi] inclusive

 private:
  uint64_t s_;
};

// Makes the values of one leaf (row-major over the leaf's stored shape).
using Gen = std::function<std::vector<double>(const Shape& stored, Rng& rng)>;

namespace gen {
Gen uniform(double lo, double hi);
// Uniform in [lo, hi) but at least `margin` away from every kink (relu/abs/clamp
// kinks), so central differences never straddle one.
Gen away_from(double lo, double hi, std::vector<double> kinks, double margin = 0.05);
Gen magnitude(double lo, double hi);  // |x| in [lo, hi), random sign (divisors)
// All values distinct and at least (hi-lo)/n apart, randomly placed: no ties for
// max / max_pool / argmax, and FD steps never change which element wins.
Gen distinct(double lo, double hi);
Gen integers(int64_t lo, int64_t hi);  // inclusive (labels, indices, seeds)
Gen choice(std::vector<double> set);   // values drawn from a small set (ties!)
Gen values(std::vector<double> v);     // exactly these values, cycled
Gen prob_rows(double lo = 0.1);        // positive, each last-dim row sums to 1
}  // namespace gen

// How the build function sees an input: the leaf itself, or a view of a leaf
// with a different layout (exercises the strided paths of kernels and the
// backward rules of views).
enum class Layout {
  contig,      // the leaf
  transposed,  // leaf of shape [..., b, a] viewed through transpose(-2, -1)
  permuted,    // leaf with reversed axes viewed through permute(reverse)
  narrowed,    // leaf with 3 extra elements in the last dim viewed via narrow(-1, 1, n)
  expanded,    // leaf of shape `stored` viewed through expand(shape) (stride 0)
};

struct Input {
  std::string name;
  Shape shape;  // the shape the build function sees
  DType dtype = DType::f32;
  Gen gen;
  Layout layout = Layout::contig;
  Shape stored;      // Layout::expanded only: the leaf's shape
  bool diff = true;  // f32 inputs: a param (gets a gradient) in grad mode
};

// Element error bound: abs * max(1, max|ref|) + rel * |ref_i|.
// The defaults allow ~25 f32 ulps: observed errors of the CPU backend are ~10x
// below them, and a kernel that loses more precision than that (a cruder exp,
// a float constant typo) should be noticed.
struct Tol {
  double abs = 3e-6;
  double rel = 3e-6;
};

using BuildFn = std::function<Tensor(Context&, const std::vector<Tensor>& x)>;
// Independent semantic check of a composite in double: gets the logical input
// values (as the build function saw them) and the reference output; returns an
// error message, or "" when the output is what the API promises.
using SpecFn = std::function<std::string(const std::vector<RefValue>& in, const RefValue& out)>;

struct Case {
  std::string name;     // unique, [a-z0-9_]
  std::vector<Op> ops;  // ops this case is meant to cover (must appear in its graphs)
  std::vector<Input> inputs;
  BuildFn build;
  Tol tol;            // eval: CPU f32 vs double reference
  bool grad = false;  // also run grad mode (output must be f32)
  // Grad mode runs finite differences (the backward rules' check). Large cases
  // (big enough that kernels split work over threads) set false: their grad mode
  // compares the CPU's gradients with the reference's only.
  bool fd = true;
  Tol grad_tol{2e-5, 2e-5};  // grad mode: CPU f32 grads vs double reference grads
  SpecFn spec;               // optional
  // Set by make_cases: the op family whose list added the case (ops.def), or ""
  // for the thread-count cases.
  std::string family;
};

// Test size vs perf size of a dimension: z(4, 256) is 4 in tests, 256 in perf mode.
struct Sz {
  bool big = false;
  int64_t operator()(int64_t small, int64_t large) const { return big ? large : small; }
};

// A case with default tolerances (tweak the returned value for others).
Case make_case(std::string name, std::vector<Op> ops, std::vector<Input> inputs, BuildFn build,
               bool grad);

// Input helpers.
Input in(std::string name, Shape shape, Gen g = gen::uniform(-1, 1));
Input in_i32(std::string name, Shape shape, Gen g);
Input constant(Input x);                // diff = false
Input as(Input x, DType t);             // other dtype (no grad for non-f32)
Input with(Input x, Layout l);          // transposed / permuted / narrowed
Input expanded(Input x, Shape stored);  // Layout::expanded from `stored`
const char* layout_name(Layout l);

// The case registry (explicit family lists, no static-init order games).
std::vector<Case> make_cases(Sz z);
const std::vector<Case>& all_cases();  // test sizes, built once
const Case* find_case(const std::string& name);

// One list per op family (ops.def), in tests/ops/cases/cases_<family>.cpp.
void add_views_cases(std::vector<Case>& cs, Sz z);
void add_copy_cases(std::vector<Case>& cs, Sz z);
void add_binary_cases(std::vector<Case>& cs, Sz z);
void add_unary_cases(std::vector<Case>& cs, Sz z);
void add_reduce_cases(std::vector<Case>& cs, Sz z);
void add_matmul_cases(std::vector<Case>& cs, Sz z);
void add_softmax_cases(std::vector<Case>& cs, Sz z);
void add_index_cases(std::vector<Case>& cs, Sz z);
void add_conv_cases(std::vector<Case>& cs, Sz z);
void add_pool_cases(std::vector<Case>& cs, Sz z);
void add_norm_cases(std::vector<Case>& cs, Sz z);
void add_attention_cases(std::vector<Case>& cs, Sz z);
void add_loss_cases(std::vector<Case>& cs, Sz z);
void add_optim_cases(std::vector<Case>& cs, Sz z);
// Thread-count cases of ops from several families (cases_threads.cpp).
void add_thread_cases(std::vector<Case>& cs, Sz z);

// Spec helpers for case files: compare a double value computed independently.
// The tolerance is relative to max(1, max|want|): composites legitimately use f32
// constants (1/n, 1/(1-p), 0.7f), while semantic slips (wrong divisor, biased vs
// unbiased variance, a missing term) are orders of magnitude larger.
std::string spec_compare(const RefValue& want, const RefValue& got, double tol = 1e-6);
RefValue ref_value(const Shape& s, std::vector<double> v);

}  // namespace kiln::test
