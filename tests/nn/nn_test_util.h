// Shared helpers of the nn tests: a double-precision check of a layer's output
// and of the gradients of every leaf it depends on, by central differences of a
// double reference written in the test.
#pragma once
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kiln/kiln.h"

namespace kiln::test {

using Values = std::vector<double>;
// The reference: the layer's output from the values of the leaves (same order
// as the `leaves` handed to check_layer).
using RefFn = std::function<Values(const std::vector<Values>& leaves)>;

inline Values as_double(Tensor t) {
  const std::vector<float> f = t.get<float>();
  return Values(f.begin(), f.end());
}

inline std::vector<float> random_values(size_t n, uint64_t seed, double sd = 1.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, sd);
  std::vector<float> v(n);
  for (float& x : v) x = float(d(rng));
  return v;
}

inline void expect_close(const Values& got, const Values& want, double atol, double rtol,
                         const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i])) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "]: got " << got[i] << " want " << want[i];
}

// Builds loss = sum(y * R) (R fixed random), its backward pass, allocates every
// tensor of ctx without memory, fills `inputs` (float leaves not owned by a
// module) with random values, runs `before_run` (for i32 inputs), computes and
// compares y with ref and the gradient of every leaf with central differences
// of sum(ref * R). Leaves must be f32 params (their memory set already or here).
inline void check_layer(Context& ctx, Tensor y, const std::vector<Tensor>& leaves,
                        const std::vector<Tensor>& inputs, const RefFn& ref, double atol = 1e-4,
                        double rtol = 1e-3, const std::function<void()>& before_run = {}) {
  Tensor r = ctx.tensor(f32, y.shape(), "R");
  Tensor loss = sum(y * r);
  Graph g = Graph::forward({loss, y});
  g.backward(loss);
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  const std::vector<float> rv = random_values(size_t(y.numel()), 99);
  r.set(rv);
  uint64_t seed = 7;
  for (Tensor x : inputs) x.set(random_values(size_t(x.numel()), seed++));
  if (before_run) before_run();
  cpu.compute(g);

  std::vector<Values> vals;
  for (Tensor l : leaves) vals.push_back(as_double(l));
  const Values want = ref(vals);
  expect_close(as_double(y), want, atol, rtol, "output");

  auto objective = [&](const std::vector<Values>& v) {
    const Values out = ref(v);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * double(rv[i]);
    return s;
  };
  const double h = 1e-5;
  for (size_t li = 0; li < leaves.size(); ++li) {
    Tensor gt = g.grad(leaves[li]);
    ASSERT_TRUE(gt.defined()) << "no gradient for " << leaves[li].name();
    Values fd(vals[li].size());
    std::vector<Values> v = vals;
    for (size_t i = 0; i < fd.size(); ++i) {
      const double x0 = v[li][i];
      v[li][i] = x0 + h;
      const double up = objective(v);
      v[li][i] = x0 - h;
      const double down = objective(v);
      v[li][i] = x0;
      fd[i] = (up - down) / (2 * h);
    }
    expect_close(as_double(gt), fd, atol * 10, rtol * 10, "grad of " + leaves[li].name());
  }
}

}  // namespace kiln::test
