// GradStore and the stand-alone Optimizer: gradients of several backward passes
// over different graphs that share weights gathered into one store, one step on
// their sum (against torch.optim.AdamW in double), the difference from stepping
// per pass, and seed 004's segment-by-segment backward.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "common/error_check.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/grad_store.h"
#include "opt_test_util.h"

namespace kiln::test {
namespace {

std::vector<float> random_vec(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  std::mt19937_64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = float(lo + (hi - lo) * (double(rng() >> 11) * (1.0 / 9007199254740992.0)));
  return v;
}

// Two graphs over one context sharing W: A reads W and a, B reads W and b.
struct TwoGraphs {
  Context ctx;
  Tensor W = ctx.param(f32, {4, 3}, "W"), a = ctx.param(f32, {3}, "a"),
         b = ctx.param(f32, {3}, "b");
  Tensor xa = ctx.input(f32, {5, 4}, "xa"), xb = ctx.input(f32, {2, 4}, "xb");
  Tensor la = mean(sqr(tanh(matmul(xa, W) + a))), lb = sum(matmul(xb, W) * b);
  Graph ga = make(la), gb = make(lb);
  CpuBackend cpu{1};
  std::unique_ptr<Buffer> buf = allocate_tensors(ctx, cpu);

  static Graph make(Tensor loss) {
    Graph g = Graph::forward(loss);
    g.backward(loss);
    return g;
  }
  void init(uint64_t seed) {
    W.set(random_vec(12, seed));
    a.set(random_vec(3, seed + 1));
    b.set(random_vec(3, seed + 2));
    xa.set(random_vec(20, seed + 3, -2, 2));
    xb.set(random_vec(8, seed + 4, -2, 2));
  }
  // Runs both passes and returns their stores.
  std::pair<GradStore, GradStore> passes() {
    ga.reset_grads();
    gb.reset_grads();
    cpu.compute(ga);
    cpu.compute(gb);
    return {GradStore(ga), GradStore(gb)};
  }
};

TEST(GradStore, MergeAddsSharedParamsAndCopiesTheOthers) {
  TwoGraphs m;
  m.init(1);
  auto [sa, sb] = m.passes();
  ASSERT_EQ(sa.size(), 2u);
  ASSERT_EQ(sb.size(), 2u);
  EXPECT_FALSE(sa.contains(m.b));
  GradStore total;
  EXPECT_TRUE(total.empty());
  total.merge(sa);
  total.merge(sb);
  ASSERT_EQ(total.size(), 3u);
  const std::vector<Tensor> order = total.params();
  EXPECT_TRUE(order[0] == m.W || order[1] == m.W);
  const std::vector<float> wa = m.ga.grad(m.W).get<float>(), wb = m.gb.grad(m.W).get<float>();
  for (size_t i = 0; i < 12; ++i) EXPECT_FLOAT_EQ(total.get(m.W)[i], wa[i] + wb[i]) << i;
  EXPECT_EQ(
      max_abs_diff({total.get(m.a).begin(), total.get(m.a).end()}, m.ga.grad(m.a).get<float>()),
      0.0);
  EXPECT_EQ(
      max_abs_diff({total.get(m.b).begin(), total.get(m.b).end()}, m.gb.grad(m.b).get<float>()),
      0.0);
  // dLb/db = column sums of xb W: checks that the store read the right values.
  const std::vector<float> xb = m.xb.get<float>(), W = m.W.get<float>();
  for (int j = 0; j < 3; ++j) {
    double want = 0;
    for (int r = 0; r < 2; ++r)
      for (int k = 0; k < 4; ++k) want += double(xb[size_t(r * 4 + k)]) * W[size_t(k * 3 + j)];
    EXPECT_NEAR(total.get(m.b)[size_t(j)], want, 1e-5);
  }
}

TEST(GradStore, ScaleNormClipClearRemove) {
  TwoGraphs m;
  m.init(2);
  GradStore s = m.passes().first;
  double sq = 0;
  for (const Tensor& p : s.params())
    for (float x : s.get(p)) sq += double(x) * x;
  EXPECT_NEAR(s.norm(), std::sqrt(sq), 1e-12 * std::sqrt(sq));
  s.scale(3.0f);
  EXPECT_NEAR(s.norm(), 3 * std::sqrt(sq), 1e-6 * std::sqrt(sq));
  const double before = s.norm();
  EXPECT_DOUBLE_EQ(s.clip(float(before * 2)), before);  // below the limit: unchanged
  EXPECT_NEAR(s.norm(), before, 1e-9);
  EXPECT_DOUBLE_EQ(s.clip(0.5f), before);
  EXPECT_NEAR(s.norm(), 0.5, 1e-5);
  const std::vector<float> a = s.remove(m.a);
  EXPECT_EQ(a.size(), 3u);
  EXPECT_FALSE(s.contains(m.a));
  EXPECT_TRUE(s.contains(m.W));
  EXPECT_TRUE(s.remove(m.a).empty());
  EXPECT_KILN_ERROR(s.get(m.a), "grad_store", "no gradient", "'a'");
  EXPECT_KILN_ERROR(s.add(m.W, std::vector<float>(5)), "grad_store", "'W'", "5 values");
  EXPECT_KILN_ERROR(s.add(m.xa, m.xa), "grad_store", "'xa'", "not a param");
  EXPECT_KILN_ERROR(s.clip(-1.0f), "grad_store", "max_norm");
  s.clear();
  EXPECT_TRUE(s.empty());
  EXPECT_EQ(s.norm(), 0.0);
}

// torch.optim.AdamW's step t on double state.
void host_adamw(std::vector<double>& p, std::vector<double>& mm, std::vector<double>& vv,
                std::span<const float> g, const AdamWParams& ap, int t) {
  for (size_t i = 0; i < p.size(); ++i) {
    p[i] *= 1 - double(ap.lr) * ap.weight_decay;
    mm[i] = ap.beta1 * mm[i] + (1 - double(ap.beta1)) * g[i];
    vv[i] = ap.beta2 * vv[i] + (1 - double(ap.beta2)) * double(g[i]) * g[i];
    const double mh = mm[i] / (1 - std::pow(double(ap.beta1), t));
    const double vh = vv[i] / (1 - std::pow(double(ap.beta2), t));
    p[i] -= ap.lr * mh / (std::sqrt(vh) + ap.eps);
  }
}

TEST(GradStore, OneAdamWStepOnTheGatheredStoreIsOneStepOnTheSum) {
  OptimizerParams q;
  q.adamw.lr = 0.05f;
  q.adamw.weight_decay = 0.1f;
  TwoGraphs m;
  m.init(3);
  Optimizer opt({m.W, m.a, m.b}, m.cpu, {.schedule = schedule::constant(q)});
  std::vector<double> w(12), mw(12), vw(12);
  const std::vector<float> w0 = m.W.get<float>();
  w.assign(w0.begin(), w0.end());
  for (int t = 1; t <= 3; ++t) {
    auto [sa, sb] = m.passes();
    GradStore total;
    total.merge(sa);
    total.merge(sb);
    host_adamw(w, mw, vw, total.get(m.W), q.adamw, t);
    opt.step(total);
    const std::vector<float> got = m.W.get<float>();
    for (size_t i = 0; i < 12; ++i) ASSERT_NEAR(got[i], w[i], 2e-6) << "step " << t << " " << i;
  }
  EXPECT_EQ(opt.steps(), 3);
  const std::vector<float> mstate = opt.state(m.W).m.get<float>();
  for (size_t i = 0; i < 12; ++i) EXPECT_NEAR(mstate[i], mw[i], 1e-6);
}

// Stepping once per pass is what the store avoids: with AdamW (not linear in
// the gradient) the result differs; with plain SGD it does not (the control).
TEST(GradStore, SteppingPerPassDiffersForAdamWButNotForSgd) {
  for (OptimizerType type : {OptimizerType::adamw, OptimizerType::sgd}) {
    OptimizerParams q;
    q.set_lr(0.05f);
    TwoGraphs gathered, per_pass;
    gathered.init(4);
    per_pass.init(4);
    Optimizer og({gathered.W, gathered.a, gathered.b}, gathered.cpu,
                 {.type = type, .schedule = schedule::constant(q)});
    Optimizer op({per_pass.W, per_pass.a, per_pass.b}, per_pass.cpu,
                 {.type = type, .schedule = schedule::constant(q)});
    auto [ga, gb] = gathered.passes();
    ga.merge(gb);
    og.step(ga);
    auto [pa, pb] = per_pass.passes();  // both passes at the same weights
    op.step(pa);
    op.step(pb);
    const double d = max_abs_diff(gathered.W.get<float>(), per_pass.W.get<float>());
    if (type == OptimizerType::adamw) EXPECT_GT(d, 1e-2) << "AdamW per pass equals gathered";
    else EXPECT_LT(d, 1e-6) << "SGD is linear: per pass must equal gathered";
    // a and b each had one gradient, so one step either way.
    EXPECT_LT(max_abs_diff(gathered.a.get<float>(), per_pass.a.get<float>()), 1e-7);
  }
}

TEST(GradStore, OptimizerErrors) {
  TwoGraphs m;
  m.init(5);
  Optimizer opt({m.W}, m.cpu);
  GradStore s = m.passes().first;  // holds W and a
  EXPECT_KILN_ERROR(opt.step(s), "optimizer", "'a'", "not one of this optimizer's 1 params");
  EXPECT_KILN_ERROR((Optimizer({m.W, m.W}, m.cpu)), "optimizer", "'W'", "twice");
  Context other;
  Tensor unplaced = other.param(f32, {2}, "u");
  EXPECT_KILN_ERROR((Optimizer({unplaced}, m.cpu)), "optimizer", "'u'", "no memory");
}

// Seed 004 (a candle user's checkpointing by hand): run the segments forward
// one at a time with each input detached, then backward segment by segment
// from the last, feeding each segment the gradient of its output, and gather
// the params' gradients in one store. The segments share W (a recurrent net),
// so the store must add its three contributions. Against the whole graph.
TEST(GradStore, SegmentBySegmentBackwardOfSeed004) {
  constexpr int kSegments = 3;
  Context ctx;
  Tensor W = ctx.param(f32, {6, 6}, "W");
  std::vector<Tensor> bias;
  for (int k = 0; k < kSegments; ++k) bias.push_back(ctx.param(f32, {6}, "b" + std::to_string(k)));
  auto segment = [&](int k, Tensor h) { return tanh(matmul(h, W) + bias[size_t(k)]); };
  Tensor x = ctx.param(f32, {4, 6}, "x");  // a param: the reference has its gradient
  // The reference: one graph over all segments, loss = sum(y^2) / 2.
  Tensor y = x;
  for (int k = 0; k < kSegments; ++k) y = segment(k, y);
  Tensor full_loss = sum(sqr(y)) * 0.5f;
  Graph full = Graph::forward(full_loss);
  full.backward(full_loss);
  // One graph per segment: its detached input (a param, so it gets a gradient)
  // and the incoming gradient; backward of sum(out * incoming).
  std::vector<Tensor> in, out, incoming;
  std::vector<Graph> seg;
  for (int k = 0; k < kSegments; ++k) {
    in.push_back(ctx.param(f32, {4, 6}, "in" + std::to_string(k)));
    out.push_back(segment(k, in.back()));
    incoming.push_back(ctx.input(f32, {4, 6}, "incoming" + std::to_string(k)));
    Tensor l = sum(out.back() * incoming.back());
    seg.push_back(Graph::forward({l, out.back()}));
    seg.back().backward(l);
  }
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  W.set(random_vec(36, 10, -0.6, 0.6));
  for (int k = 0; k < kSegments; ++k) bias[size_t(k)].set(random_vec(6, 20 + k));
  x.set(random_vec(24, 30, -2, 2));
  cpu.compute(full);

  // Forward, segment by segment (detach: copy the values into the next input).
  std::vector<float> xs = x.get<float>();
  for (int k = 0; k < kSegments; ++k) {
    in[size_t(k)].set(xs);
    cpu.compute(
        std::span<TensorNode* const>(seg[size_t(k)].nodes().data(), seg[size_t(k)].n_forward()));
    xs = out[size_t(k)].get<float>();
  }
  // Backward: d(sum(y^2)/2)/dy = y, then each segment from the last.
  std::vector<float> grad = xs;
  GradStore grads;
  for (int k = kSegments - 1; k >= 0; --k) {
    Graph& g = seg[size_t(k)];
    incoming[size_t(k)].set(grad);
    g.reset_grads();
    cpu.compute(g);  // recomputes the segment's forward, then its backward
    GradStore gs(g);
    grad = gs.remove(in[size_t(k)]);
    grads.merge(gs);
  }
  ASSERT_EQ(grads.size(), size_t(1 + kSegments));
  auto expect_same = [&](Tensor p) {
    const std::vector<float> want = full.grad(p).get<float>();
    std::span<const float> got = grads.get(p);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i)
      EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0f, std::fabs(want[i]))) << p.name() << i;
  };
  expect_same(W);
  for (const Tensor& b : bias) expect_same(b);
  // What the first segment passed back is the input's gradient.
  const std::vector<float> dx = full.grad(x).get<float>();
  ASSERT_EQ(grad.size(), dx.size());
  for (size_t i = 0; i < dx.size(); ++i) EXPECT_NEAR(grad[i], dx[i], 1e-5) << i;
}

}  // namespace
}  // namespace kiln::test
