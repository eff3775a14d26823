// Grad mode: finite differences in double against the library's backward graph
// (evaluated by the double reference), then the CPU's f32 gradients against
// that, then gradient accumulation over runs. Also: which ops a case covers.
#include <cmath>
#include <sstream>

#include "kiln/ext/tensor_node.h"
#include "ops/harness/check.h"
#include "ops/harness/session.h"

namespace kiln::test {

namespace {

// Relative step of the central differences. Truncation error ~h^2, rounding
// error ~1e-16 |loss| / h: both far below the 1e-6 tolerance for the smooth,
// O(1)-sized functions the cases use.
constexpr double kFdStep = 1e-6;
const Tol kFdTol{1e-6, 1e-6};

std::string input_label(const Case& c, size_t i) {
  return "d loss / d '" + c.inputs[i].name + "' (" + layout_name(c.inputs[i].layout) + ")";
}

}  // namespace

CheckResult check_grad(const Case& c) {
  return guarded([&](CheckResult& r) {
    if (!c.grad) throw RefError("case '" + c.name + "' has no grad mode");
    Session s(c, true);
    if (s.params.empty()) throw RefError("grad case without a differentiable f32 input");
    std::vector<Tensor> gps;
    for (size_t i : s.params) {
      Tensor gp = s.g.grad(s.b.leaves[i]);
      if (!gp.defined()) {
        r.fail(input_label(c, i) + ": Graph::grad returned no gradient");
        return;
      }
      if (!(gp.shape() == s.b.leaves[i].shape())) {
        r.fail(input_label(c, i) + ": gradient shape " + gp.shape().str() + " != param shape " +
               s.b.leaves[i].shape().str());
        return;
      }
      gps.push_back(gp);
    }

    // (a) The whole graph (forward + backward) in double.
    RefValues full = s.leaf_values();
    fill_leaves(s.g, full);
    ref_eval(s.g.nodes(), full);
    std::vector<RefValue> ref_grads;
    for (const Tensor& gp : gps) ref_grads.push_back(full.at(gp.node()));

    // Central differences of the double forward pass, one element at a time.
    const std::span<TensorNode* const> fwd(s.g.nodes().data(), s.g.n_forward());
    RefValues vals = s.leaf_values();
    fill_leaves(s.g, vals);
    // sum(out * R) over the finite outputs: an infinite output (a masked entry)
    // is a constant with R = 0 there (see Session::r_values), and would make the
    // differences inf - inf.
    auto loss_at = [&]() {
      ref_eval(fwd, vals);
      const std::vector<double>& out = vals.at(s.b.out.node()).v;
      double l = 0;
      for (size_t k = 0; k < out.size(); ++k)
        if (!std::isinf(out[k])) l += out[k] * s.r_values[k];
      return l;
    };
    for (size_t k = 0; k < s.params.size() && c.fd; ++k) {
      std::vector<double>& x = vals.at(s.b.leaves[s.params[k]].node()).v;
      RefValue fd = ref_grads[k];
      for (size_t e = 0; e < x.size(); ++e) {
        const double x0 = x[e], h = kFdStep * std::max(1.0, std::fabs(x0));
        x[e] = x0 + h;
        const double lp = loss_at();
        x[e] = x0 - h;
        const double lm = loss_at();
        x[e] = x0;
        fd.v[e] = (lp - lm) / (2 * h);
      }
      double worst = 0;
      const std::string err = compare(
          fd, ref_grads[k], kFdTol,
          input_label(c, s.params[k]) + ": backward graph (double) vs finite differences", &worst);
      if (!err.empty()) r.fail(err);
      if (verbose())
        r.notes +=
            input_label(c, s.params[k]) + ": FD worst " + std::to_string(worst) + " x bound\n";
    }

    // (b) The same graph on the CPU in f32.
    CpuBackend cpu(1);
    s.allocate(cpu);
    s.run(cpu);
    std::vector<RefValue> first;
    for (size_t k = 0; k < gps.size(); ++k) {
      first.push_back(download(gps[k]));
      double worst = 0;
      const std::string err =
          compare(ref_grads[k], first[k], c.grad_tol,
                  input_label(c, s.params[k]) + ": CPU (f32) vs double reference", &worst);
      if (!err.empty()) r.fail(err);
      if (verbose())
        r.notes +=
            input_label(c, s.params[k]) + ": CPU worst " + std::to_string(worst) + " x bound\n";
    }

    // (c) Gradients accumulate over runs; reset_grads() zeroes them.
    s.run(cpu);
    for (size_t k = 0; k < gps.size(); ++k) {
      RefValue twice = first[k];
      for (double& v : twice.v) v *= 2;
      const std::string err = compare_exact(twice, download(gps[k]),
                                            input_label(c, s.params[k]) + ": after two runs (2x)");
      if (!err.empty()) r.fail(err);
    }
    s.g.reset_grads();
    for (size_t k = 0; k < gps.size(); ++k) {
      RefValue zero = first[k];
      for (double& v : zero.v) v = 0;
      const std::string err = compare_exact(zero, download(gps[k]),
                                            input_label(c, s.params[k]) + ": after reset_grads");
      if (!err.empty()) r.fail(err);
    }
    s.run(cpu);
    for (size_t k = 0; k < gps.size(); ++k) {
      const std::string err = compare_exact(first[k], download(gps[k]),
                                            input_label(c, s.params[k]) + ": run after reset");
      if (!err.empty()) r.fail(err);
    }
  });
}

CaseOps case_ops(const Case& c) {
  CaseOps ops;
  try {
    Session s(c, c.grad);
    for (TensorNode* n : s.g.leafs()) ops.eval_ops[size_t(n->op)] = true;
    for (TensorNode* n : s.g.nodes()) ops.eval_ops[size_t(n->op)] = true;
    if (c.grad) {
      // A forward node's rule ran when it got a gradient and passed one to a source.
      for (size_t k = 0; k < s.g.n_forward(); ++k) {
        TensorNode* n = s.g.nodes()[k];
        if (!s.g.grad(Tensor(n)).defined()) continue;
        for (int i = 0; i < n->n_src; ++i)
          if (s.g.grad(Tensor(n->src[i])).defined()) ops.grad_ops[size_t(n->op)] = true;
      }
    }
  } catch (const std::exception& e) {
    ops.error = e.what();
  }
  return ops;
}

}  // namespace kiln::test
