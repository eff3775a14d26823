// Gradient accumulation as the backward pass builds it: a weight's product dW is
// added into its accumulator by the GEMM (MATMUL_ACC), so gradients summed over
// micro-batches must equal the gradient of one batch of all of them, in f32 and
// under the bf16 policy; and the q/k/v slices of a fused projection get one
// joined gradient (a concat), not three zero pads added together.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"
#include "kiln/opt.h"

namespace kiln::test {
namespace {

constexpr int64_t kT = 8, kDim = 32, kHeads = 4;

std::vector<float> random_values(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A pre-LN transformer block and an output Linear, physical batch B, trained
// with mse; the same init for every B.
struct Block {
  Block(int64_t B, DType precision) {
    ctx.set_matmul_precision(precision);
    net.push_back<nn::TransformerBlock>(kDim, kHeads, 0.0f, true);
    net.push_back<nn::Linear>(kDim, 8);
    x = ctx.input(f32, {B, kT, kDim}, "x");
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = net.forward(x);
    cfg.loss = LossKind::mse;
    cfg.model = &net;
    cfg.n_threads = 2;
    opt = std::make_unique<OptContext>(cfg);
    net.init(3);
  }
  Context ctx;
  nn::Sequential net{ctx};
  Tensor x;
  std::unique_ptr<OptContext> opt;
};

std::vector<float> slice(const std::vector<float>& v, size_t part, size_t parts) {
  const size_t n = v.size() / parts;
  return {v.begin() + std::ptrdiff_t(part * n), v.begin() + std::ptrdiff_t((part + 1) * n)};
}

void check_micro_batches_equal_one_batch(DType precision) {
  constexpr int64_t kMicro = 2, kParts = 4;
  Block small(kMicro, precision), big(kMicro * kParts, precision);
  const std::vector<float> xs = random_values(size_t(kMicro * kParts * kT * kDim), 1);
  const std::vector<float> ys = random_values(size_t(kMicro * kParts * kT * 8), 2);
  // Each micro-batch's loss is the mean over its rows: the four gradients sum
  // to kParts times the big batch's.
  for (int64_t p = 0; p < kParts; ++p) {
    small.x.set(slice(xs, size_t(p), kParts));
    small.opt->labels().set(slice(ys, size_t(p), kParts));
    small.opt->forward_backward();
  }
  big.x.set(xs);
  big.opt->labels().set(ys);
  big.opt->forward_backward();
  const auto ps = small.net.named_parameters(), pb = big.net.named_parameters();
  ASSERT_EQ(ps.size(), pb.size());
  for (size_t i = 0; i < ps.size(); ++i) {
    const std::vector<float> gs = small.opt->grad(ps[i].second).get<float>();
    const std::vector<float> gb = big.opt->grad(pb[i].second).get<float>();
    double scale = 1e-6, diff = 0;
    for (size_t k = 0; k < gb.size(); ++k) {
      scale = std::max(scale, double(std::fabs(gb[k])));
      diff = std::max(diff, std::fabs(double(gs[k]) / kParts - double(gb[k])));
    }
    EXPECT_LT(diff, 1e-4 * scale) << ps[i].first << " (" << dtype_name(precision) << ")";
  }
  // The weights' gradients went straight into their accumulators.
  int matmul_acc = 0, pads = 0, concats = 0;
  for (const TensorNode* n : small.opt->graph().nodes()) {
    matmul_acc += n->op == Op::MATMUL_ACC;
    pads += n->op == Op::PAD;
    concats += n->op == Op::CONCAT;
  }
  EXPECT_EQ(matmul_acc, 5);  // c_attn, c_proj, c_fc, mlp.c_proj, the output Linear
  EXPECT_EQ(pads, 0);        // q, k and v's gradients are joined, not padded,
  EXPECT_EQ(concats, 0);     // in place: ATTENTION_BACK writes them as c_attn's output
  // After a step the accumulators start again from zero.
  small.opt->optimizer_step();
  for (const auto& [name, p] : small.net.named_parameters())
    for (float g : small.opt->grad(p).get<float>()) ASSERT_EQ(g, 0.0f) << name;
}

TEST(GradAccumulation, MicroBatchesEqualOneBatchF32) { check_micro_batches_equal_one_batch(f32); }
TEST(GradAccumulation, MicroBatchesEqualOneBatchBf16) { check_micro_batches_equal_one_batch(bf16); }

// dL/dz = x^T (2 y) for y = x @ z, L = sum(y^2), in double.
std::vector<double> grad_of_z(const std::vector<float>& x, const std::vector<double>& z) {
  std::vector<double> g(15, 0.0);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 5; ++j) {
      double y = 0;
      for (int64_t q = 0; q < 3; ++q) y += double(x[size_t(i * 3 + q)]) * z[size_t(q * 5 + j)];
      for (int64_t k = 0; k < 3; ++k) g[size_t(k * 5 + j)] += double(x[size_t(i * 3 + k)]) * 2 * y;
    }
  return g;
}

// A weight's product is added into its accumulator: run twice, the gradient
// doubles. When another backward node reads the product too (z = p + 2 q: the
// product is also the gradient SCALE reads for q), it is computed once and
// accumulated, not computed again.
TEST(GradAccumulation, FusedOnlyWhereNothingElseReadsTheProduct) {
  for (bool shared : {false, true}) {
    Context ctx;
    Tensor x = ctx.input(f32, {4, 3}, "x");
    Tensor p = ctx.param(f32, {3, 5}, "p"), q = ctx.param(f32, {3, 5}, "q");
    Tensor z = shared ? p + q * 2.0f : p;
    Tensor loss = sum(sqr(matmul(x, z)));
    Graph g = Graph::forward(loss);
    g.backward(loss);
    int matmul_acc = 0;
    for (const TensorNode* n : g.nodes()) matmul_acc += n->op == Op::MATMUL_ACC;
    EXPECT_EQ(matmul_acc, shared ? 0 : 1);
    CpuBackend cpu(2);
    auto buf = allocate_tensors(ctx, cpu);
    const std::vector<float> xv = random_values(12, 3), pv = random_values(15, 4),
                             qv = random_values(15, 5);
    x.set(xv);
    p.set(pv);
    q.set(qv);
    g.reset_grads();
    cpu.compute(g);
    cpu.compute(g);  // accumulates: twice the gradient
    std::vector<double> zv(15);
    for (size_t k = 0; k < 15; ++k) zv[k] = double(pv[k]) + (shared ? 2.0 * qv[k] : 0.0);
    const std::vector<double> want = grad_of_z(xv, zv);
    const std::vector<float> gp = g.grad(p).get<float>();
    for (size_t k = 0; k < 15; ++k)
      EXPECT_NEAR(gp[k], 2 * want[k], 1e-4 * (1 + std::fabs(want[k])));
    if (shared) {
      const std::vector<float> gq = g.grad(q).get<float>();
      for (size_t k = 0; k < 15; ++k)
        EXPECT_NEAR(gq[k], 4 * want[k], 1e-4 * (1 + std::fabs(want[k])));
    }
  }
}

}  // namespace
}  // namespace kiln::test
