// Graph construction and autodiff structure: execution order, which nodes get
// gradients, accumulation, and linear-time backward on 100k nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <new>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/autodiff.h"
#include "kiln/ext/op_params.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

size_t position(const Graph& g, Tensor t) {
  for (size_t i = 0; i < g.nodes().size(); ++i)
    if (g.nodes()[i] == t.node()) return i;
  return SIZE_MAX;
}

}  // namespace

TEST(OpParams, EmptyParamsPackAsZeros) {
  // NoParams has one byte of no particular value; packed, it must not become
  // the first parameter byte of the op (a MATMUL's round_bf16 flags).
  alignas(NoParams) unsigned char raw[1] = {0xff};
  const NoParams* np = new (raw) NoParams;  // default-initialized: the byte stays 0xff
  const detail::OpParamBytes b = detail::pack_params(*np);
  for (unsigned char x : b.bytes) EXPECT_EQ(x, 0);
}

TEST(Graph, NodesComeAfterTheirSources) {
  Context ctx;
  Tensor x = ctx.input(f32, {4, 3}), w = ctx.param(f32, {3, 2});
  Tensor h = relu(matmul(x, w));
  Tensor y = sum(h * h);
  Graph g = Graph::forward(y);
  EXPECT_EQ(g.leafs().size(), 2u);
  for (size_t i = 0; i < g.nodes().size(); ++i)
    for (int s = 0; s < g.nodes()[i]->n_src; ++s) {
      const TensorNode* src = g.nodes()[i]->src[s];
      if (src->op != Op::NONE) EXPECT_LT(position(g, Tensor(const_cast<TensorNode*>(src))), i);
    }
  EXPECT_TRUE(y.has_flag(kFlagOutput));
}

TEST(Graph, OnlyNodesBetweenParamsAndLossGetGradients) {
  Context ctx;
  Tensor x = ctx.input(f32, {2, 3}, "x");
  Tensor c = ctx.tensor(f32, {2, 3}, "c");
  Tensor w = ctx.param(f32, {2, 3}, "w");
  Tensor off_path = exp(x) * c;  // depends on no param
  Tensor on_path = w * off_path;
  Tensor loss = sum(on_path);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  EXPECT_TRUE(g.grad(w).defined());
  EXPECT_TRUE(g.grad(on_path).defined());
  EXPECT_FALSE(g.grad(off_path).defined());
  EXPECT_FALSE(g.grad(x).defined());
  EXPECT_FALSE(g.grad(c).defined());
  // No node of the backward pass is a gradient of a gradient: every node added
  // by backward is flagged kFlagGrad and none of them has a gradient entry.
  for (size_t i = g.n_forward(); i < g.size(); ++i) {
    EXPECT_TRUE(g.nodes()[i]->flags & kFlagGrad) << op_name(g.nodes()[i]->op);
    EXPECT_FALSE(g.grad(Tensor(g.nodes()[i])).defined());
  }
}

TEST(Graph, GradientsMatchAHandComputedExample) {
  Context ctx;
  Tensor a = ctx.param(f32, {3}, "a"), b = ctx.param(f32, {3}, "b");
  Tensor loss = sum(a * b + sqr(a));  // dL/da = b + 2a, dL/db = a
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  a.set<float>({1, 2, 3});
  b.set<float>({4, 5, 6});
  cpu.compute(g);
  EXPECT_FLOAT_EQ(loss.item(), 1 * 4 + 2 * 5 + 3 * 6 + 1 + 4 + 9);
  EXPECT_EQ(g.grad(a).get<float>(), (std::vector<float>{6, 9, 12}));
  EXPECT_EQ(g.grad(b).get<float>(), (std::vector<float>{1, 2, 3}));
  // Gradients accumulate over runs until reset.
  cpu.compute(g);
  EXPECT_EQ(g.grad(b).get<float>(), (std::vector<float>{2, 4, 6}));
  g.reset_grads();
  cpu.compute(g);
  EXPECT_EQ(g.grad(b).get<float>(), (std::vector<float>{1, 2, 3}));
}

TEST(Graph, ParamUsedTwiceSumsBothContributions) {
  Context ctx;
  Tensor w = ctx.param(f32, {2});
  Tensor loss = sum(w * 3.0f) + sum(exp(w));
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  w.set<float>({0.0f, 1.0f});
  cpu.compute(g);
  auto gw = g.grad(w).get<float>();
  EXPECT_NEAR(gw[0], 3 + 1, 1e-5);
  EXPECT_NEAR(gw[1], 3 + std::exp(1.0f), 1e-5);
}

// MUL's rule contributing d(a*b)/da = b in two halves: a rule may add to the same
// source twice, and both halves must reach the gradient.
void mul_rule_in_two_halves(detail::GradCtx& g) {
  const Tensor a = g.src(0), b = g.src(1);
  if (g.needs(0)) {
    g.add(0, sum_to(scale(g.grad() * b, 0.5f), a.shape()));
    g.add(0, sum_to(scale(g.grad() * b, 0.5f), a.shape()));
  }
  if (g.needs(1)) g.add(1, sum_to(g.grad() * a, b.shape()));
}

TEST(Graph, RuleAddingTwiceToOneSourceKeepsBothContributions) {
  detail::BackwardFn& rule = detail::backward_rule(Op::MUL);
  const detail::BackwardFn saved = rule;
  rule = mul_rule_in_two_halves;
  Context ctx;
  Tensor a = ctx.param(f32, {3}, "a"), b = ctx.param(f32, {3}, "b");
  Tensor loss = sum(a * b);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  rule = saved;
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  a.set<float>({1, 2, 3});
  b.set<float>({4, 5, 6});
  cpu.compute(g);
  EXPECT_EQ(g.grad(a).get<float>(), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(g.grad(b).get<float>(), (std::vector<float>{1, 2, 3}));
}

// The gradients of adjacent slices of one tensor (narrow's rule: each padded
// with zeros) join into ONE n-ary CONCAT, padded where no slice reaches,
// whatever order they are summed in (a gap between two slices waits as a zero
// part for the slice that fills it): no ADD, no zero part left, exact values.
void check_slices_join_in_one_concat(const std::vector<int64_t>& lens, int64_t before,
                                     int64_t after) {
  const auto n = lens.size();
  std::vector<size_t> order(n);
  for (size_t k = 0; k < n; ++k) order[k] = k;
  do {
    Context ctx;
    int64_t rows = before + after;
    for (int64_t l : lens) rows += l;
    Tensor w = ctx.param(f32, {rows, 3}, "w");
    std::vector<Tensor> m(n);
    std::vector<int64_t> start(n);
    for (size_t k = 0, at = size_t(before); k < n; at += size_t(lens[k]), ++k) {
      start[k] = int64_t(at);
      m[k] = ctx.input(f32, {lens[k], 3});
    }
    Tensor loss;
    for (size_t k : order) {  // the slices' use, so their gradients' order
      Tensor term = sum(w.narrow(0, start[k], lens[k]) * m[k]);
      loss = loss.defined() ? loss + term : term;
    }
    Graph g = Graph::forward(loss);
    g.backward(loss);
    int concats = 0, adds = 0, zero_parts = 0;
    for (size_t k = g.n_forward(); k < g.size(); ++k) {
      const TensorNode* x = g.nodes()[k];
      concats += x->op == Op::CONCAT;
      adds += x->op == Op::ADD;
      zero_parts += x->op == Op::FULL && op_params<Op::FULL>(*x).value == 0.0f;
    }
    std::string what = "order";
    for (size_t k : order) what += " " + std::to_string(k);
    EXPECT_EQ(concats, 1) << what;
    EXPECT_EQ(adds, 0) << what;
    EXPECT_EQ(zero_parts, 0) << what;
    CpuBackend cpu(2);
    auto buf = allocate_tensors(ctx, cpu);
    std::vector<float> want(size_t(rows * 3), 0.0f);
    for (size_t k = 0; k < n; ++k) {
      std::vector<float> v(size_t(lens[k] * 3));
      for (size_t e = 0; e < v.size(); ++e) v[e] = float(100 * (k + 1) + e);
      m[k].set<float>(v);
      std::copy(v.begin(), v.end(), want.begin() + start[k] * 3);
    }
    w.set<float>(std::vector<float>(size_t(rows * 3), 1.0f));
    cpu.compute(g);
    EXPECT_EQ(g.grad(w).get<float>(), want) << what;
  } while (std::next_permutation(order.begin(), order.end()));
}

TEST(Graph, AdjacentSlicesGradientsJoinInOneConcat) {
  check_slices_join_in_one_concat({2, 3}, 0, 0);
  check_slices_join_in_one_concat({2, 3}, 1, 2);
  check_slices_join_in_one_concat({2, 1, 3}, 0, 0);
  check_slices_join_in_one_concat({2, 1, 3}, 2, 1);
  check_slices_join_in_one_concat({1, 2, 1, 3}, 0, 1);
  check_slices_join_in_one_concat({1, 2, 1, 3}, 1, 0);
}

TEST(Graph, BackwardRejectsBadLosses) {
  Context ctx;
  Tensor w = ctx.param(f32, {2, 2});
  Tensor y = w * w;
  Graph g = Graph::forward(y);
  EXPECT_THROW(g.backward(y), Error);  // not a scalar
  Tensor x = ctx.input(f32, {2});
  Tensor l2 = sum(x);
  Graph g2 = Graph::forward(l2);
  EXPECT_THROW(g2.backward(l2), Error);  // depends on no param
  Tensor l3 = sum(w);
  Graph g3 = Graph::forward(l3);
  g3.backward(l3);
  EXPECT_THROW(g3.backward(l3), Error);  // twice
}

TEST(Graph, InPlaceOpOnGradientPathIsRejected) {
  Context ctx;
  Tensor acc = ctx.tensor(f32, {3}), w = ctx.param(f32, {3});
  Tensor upd = detail::make_op(Op::ACCUMULATE, f32, {3}, {acc, w * 2.0f});
  upd.node()->view_src = acc.node();
  Tensor loss = sum(upd);
  Graph g = Graph::forward(loss);
  try {
    g.backward(loss);
    FAIL() << "expected kiln::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("[backward] in-place op 'accumulate'"), std::string::npos)
        << e.what();
  }
}

TEST(Graph, DeepChainOf100kNodesBuildsAndDifferentiatesInLinearTime) {
  // A quadratic backward construction would take minutes here; linear takes
  // well under a second (the bound is loose for sanitizer builds).
  auto build = [](int n) {
    Context ctx;
    Tensor w = ctx.param(f32, {4});
    Tensor x = w;
    for (int i = 0; i < n; ++i) x = (i % 2) ? x * 1.0001f : x + w;
    Tensor loss = sum(x);
    const auto t0 = std::chrono::steady_clock::now();
    Graph g = Graph::forward(loss);
    g.backward(loss);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_GT(g.size(), size_t(2 * n));
    return s;
  };
  const double t = build(100000);
  EXPECT_LT(t, 20.0) << "backward on 100k nodes took " << t << " s";
}

TEST(Graph, DeepChainRunsAndGivesTheRightGradient) {
  Context ctx;
  Tensor w = ctx.param(f32, {1});
  Tensor x = w;
  const int n = 2000;
  for (int i = 0; i < n; ++i) x = x + w;  // x = (n+1) w
  Tensor loss = sum(x);
  Graph g = Graph::forward(loss);
  g.backward(loss);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  w.set<float>({0.5f});
  cpu.compute(g);
  EXPECT_FLOAT_EQ(loss.item(), 0.5f * (n + 1));
  EXPECT_FLOAT_EQ(g.grad(w).item(), float(n + 1));
}
