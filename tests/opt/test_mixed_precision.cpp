// Context::set_matmul_precision(bf16): the casts it puts in the graph, the values
// and gradients that result (those of the bf16-rounded operands, accumulated in
// f32), and training with it (f32 master params, same loss as f32 training).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/random_values.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"
#include "opt/opt_test_util.h"

namespace kiln::test {
namespace {

// The node's source i is a COPY to bf16 of `of` (a view of it counts), or a
// permuted view of one.
bool is_bf16_cast_of(Tensor t, int i, Tensor of) {
  const TensorNode* s = t.node()->src[i];
  if (s->op == Op::PERMUTE) s = s->src[0];
  if (s->op != Op::COPY || s->dtype != bf16) return false;
  const TensorNode* from = s->src[0];
  while (from->op != Op::NONE && from != of.node() && from->n_src > 0) from = from->src[0];
  return from == of.node();
}

using kiln_test::uniform_floats;

float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// C = A @ B in double for row-major A [M, K] and B [K, N], optionally with each
// operand rounded to bf16 first.
std::vector<double> product(const std::vector<float>& a, const std::vector<float>& b, int64_t M,
                            int64_t K, int64_t N, bool round) {
  std::vector<double> c(size_t(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t k = 0; k < K; ++k) {
      const double x = round ? round_bf16(a[size_t(i * K + k)]) : a[size_t(i * K + k)];
      for (int64_t j = 0; j < N; ++j)
        c[size_t(i * N + j)] +=
            x * (round ? round_bf16(b[size_t(k * N + j)]) : b[size_t(k * N + j)]);
    }
  return c;
}

std::vector<float> transposed(const std::vector<float>& m, int64_t rows, int64_t cols) {
  std::vector<float> t(m.size());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) t[size_t(j * rows + i)] = m[size_t(i * cols + j)];
  return t;
}

// max |got - want| relative to max |want|.
double rel_err(const std::vector<float>& got, const std::vector<double>& want) {
  double d = 0, m = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    d = std::max(d, std::fabs(got[i] - want[i]));
    m = std::max(m, std::fabs(want[i]));
  }
  return d / m;
}

TEST(MixedPrecision, MatmulCastsF32OperandsOnly) {
  Context ctx;
  Tensor a = ctx.input(f32, {20, 37}, "a"), w = ctx.param(f32, {19, 37}, "w");
  Tensor h = ctx.input(bf16, {20, 37}, "h");
  Tensor before = matmul(a, w.T());
  EXPECT_EQ(before.node()->src[0], a.node());  // default f32: no casts
  ctx.set_matmul_precision(bf16);
  EXPECT_EQ(ctx.matmul_precision(), bf16);
  Tensor y = matmul(a, w.T());
  EXPECT_TRUE(is_bf16_cast_of(y, 0, a));
  EXPECT_TRUE(is_bf16_cast_of(y, 1, w));
  // w.T() is cast as w (a contiguous conversion), then viewed transposed.
  EXPECT_EQ(y.node()->src[1]->op, Op::PERMUTE);
  EXPECT_EQ(y.node()->src[1]->src[0]->src[0], w.node());
  EXPECT_EQ(y.node()->src[1]->shape, (Shape{37, 19}));
  Tensor p = ctx.input(f32, {5, 2, 37}, "p");  // viewed as [2, 37, 5]
  EXPECT_EQ(matmul(a, p.permute({1, 2, 0})).node()->src[1]->src[0]->src[0], p.node());
  EXPECT_EQ(y.dtype(), f32);
  Tensor z = matmul(h, w.T());
  EXPECT_EQ(z.node()->src[0], h.node());  // bf16 already: used as it is
  ctx.set_matmul_precision(f32);
  EXPECT_EQ(matmul(a, w.T()).node()->src[0], a.node());
}

TEST(MixedPrecision, RejectsOtherDtypes) {
  Context ctx;
  for (DType t : {f16, i32}) {
    try {
      ctx.set_matmul_precision(t);
      ADD_FAILURE() << "no error for " << dtype_name(t);
    } catch (const Error& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("[matmul precision]"), std::string::npos) << m;
      EXPECT_NE(m.find(dtype_name(t)), std::string::npos) << m;
    }
  }
  EXPECT_EQ(ctx.matmul_precision(), f32);
}

// y = a @ w^T under bf16: y, and the gradients of loss = sum(y * g), are the
// products of the bf16-rounded values (g rounded too: the backward products
// are matmuls built under the same policy), accumulated in f32.
TEST(MixedPrecision, ValuesAndGradientsAreThoseOfRoundedOperands) {
  const int64_t M = 40, K = 70, N = 33;
  Context ctx;
  ctx.set_matmul_precision(bf16);
  Tensor a = ctx.param(f32, {M, K}, "a"), w = ctx.param(f32, {N, K}, "w");
  Tensor g = ctx.input(f32, {M, N}, "g");
  Tensor y = matmul(a, w.T());
  Tensor loss = sum(y * g);
  Graph graph = Graph::forward(loss);
  graph.backward(loss);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  const auto av = uniform_floats(size_t(M * K), 1), wv = uniform_floats(size_t(N * K), 2),
             gv = uniform_floats(size_t(M * N), 3);
  a.set(av);
  w.set(wv);
  g.set(gv);
  graph.reset_grads();
  cpu.compute(graph);

  const auto wt = transposed(wv, N, K);  // [K, N]
  const auto y_bf16 = product(av, wt, M, K, N, true), y_f32 = product(av, wt, M, K, N, false);
  EXPECT_LT(rel_err(y.get<float>(), y_bf16), 1e-6);
  EXPECT_GT(rel_err(y.get<float>(), y_f32), 1e-4);  // the rounding did happen
  EXPECT_LT(rel_err(y.get<float>(), y_f32), 2e-2);  // and is bf16-sized
  // da = g @ w (g [M, N], w [N, K]); dw = g^T @ a.
  EXPECT_LT(rel_err(graph.grad(a).get<float>(), product(gv, wv, M, N, K, true)), 1e-6);
  EXPECT_LT(rel_err(graph.grad(w).get<float>(), product(transposed(gv, M, N), av, N, M, K, true)),
            1e-6);
  EXPECT_EQ(graph.grad(w).dtype(), f32);
  // Both backward products read one bf16 cast of dy (= g).
  int casts_of_g = 0;
  for (size_t i = graph.n_forward(); i < graph.size(); ++i) {
    const TensorNode* n = graph.nodes()[i];
    casts_of_g += n->op == Op::COPY && n->dtype == bf16 && n->src[0]->op != Op::PERMUTE &&
                  n->src[0]->shape == Shape{M, N};
  }
  EXPECT_EQ(casts_of_g, 1);
}

TEST(MixedPrecision, LinearLayersUseThePolicy) {
  Context ctx;
  ctx.set_matmul_precision(bf16);
  nn::Linear fc(ctx, 12, 5);
  Tensor x = ctx.input(f32, {3, 12}, "x");
  Tensor y = fc.forward(x);
  const TensorNode* mm = y.node();
  while (mm->op != Op::MATMUL) mm = mm->src[0];
  Tensor m(const_cast<TensorNode*>(mm));
  EXPECT_TRUE(is_bf16_cast_of(m, 0, x));
  EXPECT_TRUE(is_bf16_cast_of(m, 1, fc.weight()));
  EXPECT_EQ(fc.weight().dtype(), f32);  // the master copy
}

// The blobs MLP trained under bf16 and f32 from the same init: f32 params and
// AdamW state, and losses within bf16's reach of each other.
TEST(MixedPrecision, TrainsToTheSameLossAsF32) {
  Dataset data = make_blobs(1500, 1);
  std::vector<EpochResult> hist[2];
  for (int p = 0; p < 2; ++p) {
    Mlp mlp(50, 16, p ? bf16 : f32);
    OptConfig cfg = mlp.config(100);
    AdamWParams ap;
    ap.lr = 0.02f;
    cfg.schedule = schedule::constant({ap, {}});
    OptContext opt(cfg);
    mlp.init(11);
    FitOptions o;
    o.epochs = 20;
    o.val_split = 0.2;
    o.progress = false;
    hist[p] = fit(opt, data, o);
    for (Tensor t : mlp.params()) {
      EXPECT_EQ(t.dtype(), f32);
      EXPECT_EQ(opt.state(t).m.dtype(), f32);
      EXPECT_EQ(opt.state(t).v.dtype(), f32);
    }
  }
  const EpochResult &f = hist[0].back(), &b = hist[1].back();
  EXPECT_NE(b.val.loss(), f.val.loss());  // the policy was in force
  EXPECT_NEAR(b.val.loss(), f.val.loss(), 0.02);
  EXPECT_NEAR(b.val.accuracy(), f.val.accuracy(), 0.01);
  EXPECT_LT(b.val.loss(), 0.15);
}

// Two pre-LN transformer blocks under the policy: attention takes bf16 q, k, v
// and gives a bf16 output, its backward reads them (saved in bf16), and the
// planned buffer of the training graph is clearly smaller than in f32.
TEST(MixedPrecision, AttentionRunsOnBf16AndPlannedMemoryDrops) {
  size_t planned[2] = {0, 0};
  for (int p = 0; p < 2; ++p) {
    Context ctx;
    ctx.set_matmul_precision(p ? bf16 : f32);
    nn::Sequential net(ctx);
    net.push_back<nn::TransformerBlock>(128, 4, 0.0f, true);
    net.push_back<nn::TransformerBlock>(128, 4, 0.0f, true);
    Tensor x = ctx.input(f32, {8, 64, 128}, "x");
    Tensor y = net.forward(x);
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = y;
    cfg.loss = LossKind::mse;
    cfg.model = &net;
    cfg.n_threads = 1;
    OptContext opt(cfg);
    planned[p] = opt.memory_plan().buffer_size;
    int attention = 0, attention_back = 0;
    for (const TensorNode* n : opt.graph().nodes()) {
      const DType want = p ? bf16 : f32;
      if (n->op == Op::ATTENTION) {
        ++attention;
        EXPECT_EQ(n->dtype, want);
        for (int i = 0; i < 3; ++i) EXPECT_EQ(n->src[i]->dtype, want);
      }
      if (n->op == Op::ATTENTION_BACK) {
        ++attention_back;
        EXPECT_EQ(n->dtype, f32);  // dq, dk, dv
        for (int i = 0; i < 5; ++i) EXPECT_EQ(n->src[i]->dtype, want) << "source " << i;
      }
    }
    EXPECT_EQ(attention, 2);
    EXPECT_EQ(attention_back, 2);
  }
  EXPECT_LT(double(planned[1]), 0.85 * double(planned[0]))
      << "planned " << planned[0] << " bytes in f32, " << planned[1] << " in bf16";
}

}  // namespace
}  // namespace kiln::test
