// Neural-net ops: bad input to every builder throws kiln::Error "[op] ..." naming
// the shapes; data errors (labels / indices out of range) are reported by
// CpuBackend::compute; dropout is deterministic per seed; and a few values are
// checked against hand-computed results. (Exhaustive correctness against a
// double-precision reference and finite-difference gradients lives in tests/ops.)
#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "common/error_check.h"
#include "kiln/kiln.h"

namespace {

using kiln::f16;
using kiln::f32;
using kiln::i32;
using kiln::Tensor;

// Allocates every tensor of ctx on a CPU backend and runs the graph of `out`.
struct Runner {
  kiln::CpuBackend cpu;
  std::unique_ptr<kiln::Buffer> buf;
  explicit Runner(int threads = 2) : cpu(threads) {}
  void alloc(kiln::Context& ctx) { buf = kiln::allocate_tensors(ctx, cpu); }
  void run(Tensor out) { cpu.compute(kiln::Graph::forward(out)); }
};

// ---- builder errors ----

TEST(NnOpsErrors, Softmax) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 4}), xi = ctx.input(i32, {2, 4});
  EXPECT_KILN_ERROR(kiln::softmax(xi), "softmax", "f32", "i32", "[2, 4]");
  EXPECT_KILN_ERROR(kiln::log_softmax(xi), "log_softmax", "f32", "[2, 4]");
  EXPECT_KILN_ERROR(kiln::softmax(ctx.input(f32, {})), "softmax", "scalar");
  EXPECT_KILN_ERROR(kiln::softmax(Tensor()), "softmax", "undefined");
  kiln::SoftmaxOptions o;
  o.mask = ctx.input(f32, {3});
  EXPECT_KILN_ERROR(kiln::softmax(x, o), "softmax", "mask [3]", "x [2, 4]");
  o.mask = ctx.input(f32, {3, 2, 4});  // would enlarge the result
  EXPECT_KILN_ERROR(kiln::log_softmax(x, o), "log_softmax", "[3, 2, 4]", "[2, 4]");
  o.mask = ctx.input(i32, {2, 4});
  EXPECT_KILN_ERROR(kiln::softmax(x, o), "softmax", "mask", "i32");
  o.mask = ctx.input(f32, {1, 4});  // broadcasts: fine
  EXPECT_NO_THROW(kiln::softmax(x, o));
}

TEST(NnOpsErrors, CrossEntropy) {
  kiln::Context ctx;
  Tensor logits = ctx.input(f32, {4, 10});
  EXPECT_KILN_ERROR(kiln::cross_entropy(ctx.input(f32, {4, 10, 2}), ctx.input(i32, {4})),
                    "cross_entropy", "logits", "[4, 10, 2]");
  EXPECT_KILN_ERROR(kiln::cross_entropy(logits, ctx.input(i32, {5})), "cross_entropy", "[5]",
                    "[4, 10]");
  EXPECT_KILN_ERROR(kiln::cross_entropy(logits, ctx.input(i32, {4, 1})), "cross_entropy", "[4, 1]",
                    "[4, 10]");
  EXPECT_KILN_ERROR(kiln::cross_entropy(logits, ctx.input(f32, {4, 9})), "cross_entropy", "[4, 9]",
                    "[4, 10]");
  EXPECT_KILN_ERROR(kiln::cross_entropy(logits, ctx.input(f16, {4, 10})), "cross_entropy", "f16",
                    "[4, 10]");
  EXPECT_KILN_ERROR(kiln::cross_entropy(ctx.input(i32, {4, 10}), ctx.input(i32, {4})),
                    "cross_entropy", "logits", "i32");
}

TEST(NnOpsErrors, MseLossAndOneHot) {
  kiln::Context ctx;
  EXPECT_KILN_ERROR(kiln::mse_loss(ctx.input(f32, {8, 1}), ctx.input(f32, {8})), "mse_loss",
                    "[8, 1]", "[8]");
  EXPECT_KILN_ERROR(kiln::mse_loss(ctx.input(f32, {3}), ctx.input(i32, {3})), "mse_loss", "i32");
  EXPECT_KILN_ERROR(kiln::one_hot(ctx.input(f32, {3}), 4), "one_hot", "labels", "f32", "[3]");
  EXPECT_KILN_ERROR(kiln::one_hot(ctx.input(i32, {3}), 0), "one_hot", "classes", "0");
  EXPECT_KILN_ERROR(kiln::one_hot(ctx.input(i32, {2, 2, 2, 2}), 3), "one_hot", "[2, 2, 2, 2]");
}

TEST(NnOpsErrors, Norms) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 4});
  EXPECT_KILN_ERROR(kiln::layer_norm(x, ctx.param(f32, {5})), "layer_norm", "weight is [5]",
                    "x is [2, 4]", "[4]");
  EXPECT_KILN_ERROR(kiln::layer_norm(x, ctx.param(f32, {4}), ctx.param(f32, {2, 4})), "layer_norm",
                    "bias is [2, 4]", "[2, 4]");
  EXPECT_KILN_ERROR(kiln::layer_norm(ctx.input(i32, {2, 4})), "layer_norm", "i32");
  EXPECT_KILN_ERROR(kiln::layer_norm(x, {}, {}, -1.0f), "layer_norm", "eps");
  EXPECT_KILN_ERROR(kiln::rms_norm(x, ctx.param(f32, {2})), "rms_norm", "weight is [2]",
                    "x is [2, 4]");
  EXPECT_KILN_ERROR(kiln::rms_norm(ctx.input(f32, {})), "rms_norm", "scalar");
  EXPECT_KILN_ERROR(kiln::rms_norm(x, {}, std::nanf("")), "rms_norm", "eps");
  EXPECT_KILN_ERROR(kiln::rms_norm(ctx.input(f16, {2, 4})), "rms_norm", "f16");
}

TEST(NnOpsErrors, Dropout) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {16});
  EXPECT_KILN_ERROR(kiln::dropout(x, 1.0f, 1, true), "dropout", "p", "[0, 1)", "1");
  EXPECT_KILN_ERROR(kiln::dropout(x, -0.1f, 1, true), "dropout", "-0.1");
  EXPECT_KILN_ERROR(kiln::dropout(x, 0.5f, 1, true, ctx.input(f32, {1})), "dropout", "seed_tensor",
                    "f32");
  EXPECT_KILN_ERROR(kiln::dropout(ctx.input(i32, {4}), 0.5f, 1, true), "dropout", "i32");
  // Identity (no node at all) outside training or with p = 0.
  EXPECT_EQ(kiln::dropout(x, 0.5f, 1, false), x);
  EXPECT_EQ(kiln::dropout(x, 0.0f, 1, true), x);
}

TEST(NnOpsErrors, Embedding) {
  kiln::Context ctx;
  Tensor w = ctx.param(f32, {50, 8});
  EXPECT_KILN_ERROR(kiln::embedding(w, ctx.input(f32, {3})), "embedding", "indices", "f32");
  EXPECT_KILN_ERROR(kiln::embedding(ctx.param(f32, {50, 8, 2}), ctx.input(i32, {3})), "embedding",
                    "weight", "[50, 8, 2]");
  EXPECT_KILN_ERROR(kiln::embedding(w, ctx.input(i32, {2, 2, 2, 2})), "embedding", "[2, 2, 2, 2]");
  EXPECT_KILN_ERROR(kiln::embedding(ctx.input(i32, {50, 8}), ctx.input(i32, {3})), "embedding",
                    "weight", "i32");
  EXPECT_EQ(kiln::embedding(w, ctx.input(i32, {2, 3})).shape(), (kiln::Shape{2, 3, 8}));
  EXPECT_EQ(kiln::embedding(w, ctx.input(i32, {})).shape(), (kiln::Shape{8}));
}

TEST(NnOpsErrors, ConcatPadRepeat) {
  kiln::Context ctx;
  Tensor a = ctx.input(f32, {2, 3}), b = ctx.input(f32, {2, 4}), c = ctx.input(f32, {3, 4});
  EXPECT_KILN_ERROR(kiln::concat({a, b}, 0), "concat", "tensor 1 is [2, 4]", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::concat({a, b, c}, 1), "concat", "tensor 2 is [3, 4]", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::concat({a, ctx.input(i32, {2, 3})}, 0), "concat", "i32", "f32");
  EXPECT_KILN_ERROR(kiln::concat({a, ctx.input(f32, {2, 3, 1})}, 0), "concat", "[2, 3, 1]");
  EXPECT_KILN_ERROR(kiln::concat(std::vector<Tensor>{}, 0), "concat", "at least one");
  EXPECT_KILN_ERROR(kiln::concat({a, b}, 2), "concat", "axis 2");
  EXPECT_EQ(kiln::concat({a, b}, -1).shape(), (kiln::Shape{2, 7}));
  EXPECT_EQ(kiln::concat({a}, 0), a);

  EXPECT_KILN_ERROR(kiln::pad(a, {1, 2, 3}), "pad", "pairs", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::pad(a, {1, 1, 1, 1, 1, 1}), "pad", "3", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::pad(a, {0, -1}), "pad", "negative", "[2, 3]");
  EXPECT_EQ(kiln::pad(a, {1, 2}).shape(), (kiln::Shape{2, 6}));
  EXPECT_EQ(kiln::pad(a, {0, 0, 1, 0}).shape(), (kiln::Shape{3, 3}));

  EXPECT_KILN_ERROR(kiln::repeat(a, {2}), "repeat", "1 repeats", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::repeat(a, {1, 1, 1, 1, 2}), "repeat", "at most 4", "[2, 3]");
  EXPECT_KILN_ERROR(kiln::repeat(a, {1, 0}), "repeat", ">= 1", "[2, 3]");
  EXPECT_EQ(kiln::repeat(a, {2, 1, 2}).shape(), (kiln::Shape{2, 2, 6}));
}

TEST(NnOpsErrors, ConvAndPool) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 3, 8, 8});
  Tensor w = ctx.param(f32, {4, 3, 3, 3});
  EXPECT_KILN_ERROR(kiln::conv2d(x, ctx.param(f32, {4, 2, 3, 3})), "conv2d", "[2, 3, 8, 8]",
                    "[4, 2, 3, 3]", "channels");
  EXPECT_KILN_ERROR(kiln::conv2d(ctx.input(f32, {3, 8, 8}), w), "conv2d", "[3, 8, 8]");
  EXPECT_KILN_ERROR(kiln::conv2d(x, ctx.param(f32, {4, 3, 3})), "conv2d", "weight", "[4, 3, 3]");
  EXPECT_KILN_ERROR(kiln::conv2d(x, w, ctx.param(f32, {3})), "conv2d", "bias is [3]",
                    "[4, 3, 3, 3]");
  EXPECT_KILN_ERROR(kiln::conv2d(x, ctx.param(f32, {4, 3, 9, 3})), "conv2d", "height",
                    "[2, 3, 8, 8]");
  kiln::Conv2dOptions o;
  o.stride[1] = 0;
  EXPECT_KILN_ERROR(kiln::conv2d(x, w, {}, o), "conv2d", "stride");
  kiln::Conv2dOptions ok;
  ok.padding[0] = ok.padding[1] = 1;
  ok.stride[0] = 2;
  EXPECT_EQ(kiln::conv2d(x, w, {}, ok).shape(), (kiln::Shape{2, 4, 4, 8}));

  EXPECT_KILN_ERROR(kiln::max_pool2d(ctx.input(f32, {3, 8, 8})), "max_pool2d", "[3, 8, 8]");
  kiln::Pool2dOptions p;
  p.kernel[0] = p.kernel[1] = 9;
  EXPECT_KILN_ERROR(kiln::max_pool2d(x, p), "max_pool2d", "[2, 3, 8, 8]", "kernel 9");
  kiln::Pool2dOptions q;
  q.padding[0] = 2;
  EXPECT_KILN_ERROR(kiln::avg_pool2d(x, q), "avg_pool2d", "padding", "half");
  EXPECT_EQ(kiln::avg_pool2d(x).shape(), (kiln::Shape{2, 3, 4, 4}));
}

TEST(NnOpsErrors, UnfoldAndFold) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 3, 8, 8});
  kiln::UnfoldOptions k3;
  k3.kernel[0] = k3.kernel[1] = 3;
  EXPECT_EQ(kiln::unfold(x, k3).shape(), (kiln::Shape{2, 27, 36}));
  EXPECT_KILN_ERROR(kiln::unfold(ctx.input(f32, {3, 8, 8}), k3), "unfold", "[3, 8, 8]");
  EXPECT_KILN_ERROR(kiln::unfold(ctx.input(i32, {2, 3, 8, 8}), k3), "unfold", "f32");
  kiln::UnfoldOptions big = k3;
  big.kernel[0] = 9;
  EXPECT_KILN_ERROR(kiln::unfold(x, big), "unfold", "height", "[2, 3, 8, 8]");
  kiln::UnfoldOptions bad = k3;
  bad.stride[1] = 0;
  EXPECT_KILN_ERROR(kiln::unfold(x, bad), "unfold", "stride");

  Tensor cols = ctx.input(f32, {2, 27, 36});
  EXPECT_EQ(kiln::fold(cols, 8, 8, k3).shape(), (kiln::Shape{2, 3, 8, 8}));
  EXPECT_KILN_ERROR(kiln::fold(ctx.input(f32, {2, 26, 36}), 8, 8, k3), "fold", "[2, 26, 36]",
                    "multiple", "3x3");
  EXPECT_KILN_ERROR(kiln::fold(cols, 9, 8, k3), "fold", "36 windows", "42");
  EXPECT_KILN_ERROR(kiln::fold(ctx.input(f32, {27, 36}), 8, 8, k3), "fold", "[27, 36]");
  EXPECT_KILN_ERROR(kiln::fold(cols, 0, 8, k3), "fold", "output size");
}

// ---- errors found in the data, at compute time ----

TEST(NnOpsErrors, CrossEntropyLabelOutOfRangeAtCompute) {
  kiln::Context ctx;
  Tensor logits = ctx.input(f32, {5, 10}), labels = ctx.input(i32, {5});
  Tensor loss = kiln::cross_entropy(logits, labels);
  Runner r;
  r.alloc(ctx);
  logits.set(std::vector<float>(50, 0.0f));
  labels.set<int32_t>({1, 2, 3, 12, 4});
  EXPECT_KILN_ERROR(r.run(loss), "cross_entropy", "label 12 at position 3 is out of range [0, 10)");
  labels.set<int32_t>({1, -1, 3, 2, 4});
  EXPECT_KILN_ERROR(r.run(loss), "cross_entropy", "label -1 at position 1");
  labels.set<int32_t>({1, 2, 3, 9, 0});
  EXPECT_NO_THROW(r.run(loss));
  EXPECT_NEAR(loss.item(), std::log(10.0f), 1e-5);
}

TEST(NnOpsErrors, EmbeddingIndexOutOfRangeAtCompute) {
  kiln::Context ctx;
  Tensor w = ctx.param(f32, {50, 4}), idx = ctx.input(i32, {2, 4});
  Tensor y = kiln::embedding(w, idx);
  Tensor labels = ctx.input(i32, {3});
  Tensor oh = kiln::one_hot(labels, 4);
  Runner r;
  r.alloc(ctx);
  idx.set<int32_t>({0, 1, 2, 3, 4, 70, 6, 99});
  labels.set<int32_t>({0, 4, 1});
  for (int threads : {1, 3}) {  // the first bad position, whatever the thread count
    kiln::CpuBackend cpu(threads);
    EXPECT_KILN_ERROR(cpu.compute(kiln::Graph::forward(y)), "embedding",
                      "index 70 at position 5 is out of range for 50 rows");
    EXPECT_KILN_ERROR(cpu.compute(kiln::Graph::forward(oh)), "one_hot",
                      "label 4 at position 1 is out of range [0, 4)");
  }
}

// Mixture of experts: builder checks, and an expert id out of range found by the
// kernels (forward and the weight gradient's), the first bad one whatever the
// thread count; and top-k's k.
TEST(NnOpsErrors, ExpertMatmulAndTopk) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {3, 8}), w = ctx.param(f32, {4, 5, 8}), ids = ctx.input(i32, {3, 2});
  EXPECT_KILN_ERROR(kiln::expert_matmul(x, w, ctx.input(f32, {3, 2})), "expert_matmul", "ids",
                    "i32");
  EXPECT_KILN_ERROR(kiln::expert_matmul(x, ctx.param(f32, {5, 8}), ids), "expert_matmul", "[5, 8]",
                    "[E, M, K]");
  EXPECT_KILN_ERROR(kiln::expert_matmul(ctx.input(f32, {3, 7}), w, ids), "expert_matmul", "x",
                    "[3, 7]", "[3, 8] or [3, 2, 8]");
  EXPECT_KILN_ERROR(kiln::expert_matmul(ctx.input(f32, {2, 8}), w, ids), "expert_matmul", "[2, 8]");
  EXPECT_KILN_ERROR(kiln::topk_indices(x, 9), "topk", "k = 9", "8 values per row");
  EXPECT_KILN_ERROR(kiln::topk_indices(x, 0), "topk", "k = 0");
  EXPECT_KILN_ERROR(kiln::topk_indices(ids, 1), "topk", "f32");
  EXPECT_KILN_ERROR(kiln::gather_last(x, ctx.input(i32, {2, 2})), "gather_last", "[2, 2]");

  Tensor y = kiln::expert_matmul(x, w, ids);
  Tensor loss = kiln::sum(y);
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  Runner r;
  r.alloc(ctx);
  x.set(std::vector<float>(24, 0.5f));
  w.set(std::vector<float>(160, 0.25f));
  ids.set<int32_t>({0, 3, 4, 1, -1, 2});
  for (int threads : {1, 3}) {
    kiln::CpuBackend cpu(threads);
    EXPECT_KILN_ERROR(cpu.compute(kiln::Graph::forward(y)), "expert_matmul",
                      "expert id 4 at ids[1, 0] is out of range [0, 4)");
    EXPECT_KILN_ERROR(cpu.compute(g), "expert_matmul", "expert id 4 at ids[1, 0]");
  }
  ids.set<int32_t>({0, 3, 2, 1, 3, 2});
  r.cpu.compute(g);
  EXPECT_FLOAT_EQ(y.get<float>()[0], 8 * 0.5f * 0.25f);
}

// ---- dropout ----

TEST(NnOps, DropoutIsDeterministicPerSeedAndKeepsAbout1MinusP) {
  kiln::Context ctx;
  const int64_t n = 100000;
  Tensor x = ctx.input(f32, {n});
  Tensor seed = ctx.input(i32, {1});
  Tensor a = kiln::dropout(x, 0.3f, 42, true), b = kiln::dropout(x, 0.3f, 42, true);
  Tensor c = kiln::dropout(x, 0.3f, 43, true), d = kiln::dropout(x, 0.3f, 42, true, seed);
  Runner r(3);
  r.alloc(ctx);
  x.set(std::vector<float>(n, 2.0f));
  seed.set<int32_t>({0});
  auto run = [&](Tensor t) {
    r.run(t);
    return t.get<float>();
  };
  const auto va = run(a), vb = run(b), vc = run(c), vd0 = run(d);
  EXPECT_EQ(va, vb);
  EXPECT_NE(va, vc);
  EXPECT_EQ(va, vd0);  // seed tensor 0 xor 42 = 42
  seed.set<int32_t>({7});
  EXPECT_NE(run(d), va);  // a new step's seed changes the mask without rebuilding
  seed.set<int32_t>({0});
  EXPECT_EQ(run(d), va);
  int64_t kept = 0;
  for (float v : va) {
    if (v != 0.0f) {
      ++kept;
      EXPECT_FLOAT_EQ(v, 2.0f / 0.7f);
    }
  }
  EXPECT_NEAR(double(kept) / n, 0.7, 0.01);
  // Same mask with any thread count.
  kiln::CpuBackend cpu1(1);
  cpu1.compute(kiln::Graph::forward(a));
  EXPECT_EQ(a.get<float>(), va);
}

// ---- hand-computed values ----

TEST(NnOps, SoftmaxOfKnownRows) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 3});
  Tensor s = kiln::softmax(x), ls = kiln::log_softmax(x);
  kiln::SoftmaxOptions causal;
  causal.causal = true;
  causal.scale = 2.0f;
  Tensor sc = kiln::softmax(x, causal);  // 2 rows, 3 cols: row 0 sees cols 0..1
  kiln::SoftmaxOptions masked;
  masked.mask = ctx.input(f32, {2, 3});
  Tensor sm = kiln::softmax(x, masked), lsm = kiln::log_softmax(x, masked);
  Runner r;
  r.alloc(ctx);
  x.set<float>({1, 2, 3, 1000, 1000, 1000});
  const float inf = std::numeric_limits<float>::infinity();
  masked.mask.set<float>({0, 0, 0, -inf, -inf, -inf});  // row 1 fully masked
  for (Tensor t : {s, ls, sc, sm, lsm}) r.run(t);
  const std::vector<float> want = {0.09003057f, 0.24472847f, 0.66524096f,
                                   1 / 3.f,     1 / 3.f,     1 / 3.f};
  const auto vs = s.get<float>(), vls = ls.get<float>(), vsc = sc.get<float>();
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(vs[i], want[i], 1e-6) << i;
    EXPECT_NEAR(vls[i], std::log(want[i]), 1e-5) << i;
  }
  // Causal row 0: softmax(2, 4) over cols 0..1, col 2 masked; row 1 sees all.
  EXPECT_NEAR(vsc[0], 1 / (1 + std::exp(2.0f)), 1e-6);
  EXPECT_NEAR(vsc[1], 1 / (1 + std::exp(-2.0f)), 1e-6);
  EXPECT_EQ(vsc[2], 0.0f);
  EXPECT_NEAR(vsc[3], 1 / 3.f, 1e-6);
  const auto vsm = sm.get<float>(), vlsm = lsm.get<float>();
  for (int i = 3; i < 6; ++i) {
    EXPECT_EQ(vsm[i], 0.0f);
    EXPECT_EQ(vlsm[i], -inf);
  }
}

TEST(NnOps, CrossEntropyGradientIsSoftmaxMinusOneHot) {
  kiln::Context ctx;
  Tensor logits = ctx.param(f32, {2, 3});
  Tensor labels = ctx.input(i32, {2});
  Tensor loss = kiln::cross_entropy(logits, labels);
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  Runner r;
  r.alloc(ctx);
  logits.set<float>({1, 2, 3, 0, 0, 0});
  labels.set<int32_t>({2, 0});
  r.cpu.compute(g);
  const float p[3] = {0.09003057f, 0.24472847f, 0.66524096f};
  EXPECT_NEAR(loss.item(), (-std::log(p[2]) + std::log(3.0f)) / 2, 1e-5);
  const auto gr = g.grad(logits).get<float>();
  const float want[6] = {p[0] / 2, p[1] / 2, (p[2] - 1) / 2, (1 / 3.f - 1) / 2, 1 / 6.f, 1 / 6.f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(gr[i], want[i], 1e-6) << i;
}

TEST(NnOps, Conv2dOfATinyKnownExample) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {1, 1, 3, 3});
  Tensor w = ctx.param(f32, {2, 1, 2, 2}), b = ctx.param(f32, {2});
  Tensor y = kiln::conv2d(x, w, b);
  kiln::Conv2dOptions o;
  o.padding[0] = o.padding[1] = 1;
  o.stride[0] = o.stride[1] = 2;
  Tensor yp = kiln::conv2d(x, w, {}, o);  // [1, 2, 2, 2]
  Runner r;
  r.alloc(ctx);
  x.set<float>({1, 2, 3, 4, 5, 6, 7, 8, 9});
  w.set<float>({1, 0, 0, 1,     // main diagonal
                0, 1, -1, 0});  // anti-diagonal difference
  b.set<float>({0.5f, -1});
  r.run(y);
  r.run(yp);
  EXPECT_EQ(y.shape(), (kiln::Shape{1, 2, 2, 2}));
  EXPECT_EQ(y.get<float>(), (std::vector<float>{6.5f, 8.5f, 12.5f, 14.5f, -3, -3, -3, -3}));
  // Padded, stride 2: windows start at (-1,-1), (-1,1), (1,-1), (1,1).
  EXPECT_EQ(yp.get<float>(), (std::vector<float>{1, 3, 7, 14, 0, -2, 4, -2}));
}

// The identity PyTorch documents for unfold: conv2d(x, w) equals
// w.view(O, -1) @ unfold(x) reshaped to [N, O, OH, OW]; and fold(unfold(x))
// multiplies each pixel by the number of windows covering it.
TEST(NnOps, Conv2dEqualsMatmulWithUnfoldAndFoldIsItsAdjoint) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 2, 5, 4});
  Tensor w = ctx.param(f32, {3, 2, 2, 3});
  kiln::Conv2dOptions co;
  co.stride[0] = 2, co.padding[1] = 1;
  kiln::UnfoldOptions uo;
  uo.kernel[0] = 2, uo.kernel[1] = 3, uo.stride[0] = 2, uo.padding[1] = 1;
  Tensor y = kiln::conv2d(x, w, {}, co);  // [2, 3, 2, 4]
  Tensor y2 = kiln::matmul(w.reshape({3, 12}), kiln::unfold(x, uo)).reshape({2, 3, 2, 4});
  Tensor ones = ctx.input(f32, {1, 1, 3, 3});
  kiln::UnfoldOptions k2;
  k2.kernel[0] = k2.kernel[1] = 2;
  Tensor cover = kiln::fold(kiln::unfold(ones, k2), 3, 3, k2);
  Runner r;
  r.alloc(ctx);
  std::vector<float> xv(80), wv(36);
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(int(i * 7 % 11) - 5) / 4;
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(int(i * 5 % 13) - 6) / 8;
  x.set<float>(xv);
  w.set<float>(wv);
  ones.set<float>(std::vector<float>(9, 1.0f));
  r.run(y);
  r.run(y2);
  r.run(cover);
  ASSERT_EQ(y.shape(), y2.shape());
  const std::vector<float> a = y.get<float>(), b = y2.get<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5) << i;
  EXPECT_EQ(cover.get<float>(), (std::vector<float>{1, 2, 1, 2, 4, 2, 1, 2, 1}));
}

TEST(NnOps, MaxPoolOfAKnown4x4) {
  kiln::Context ctx;
  Tensor x = ctx.param(f32, {1, 1, 4, 4});
  Tensor y = kiln::max_pool2d(x);
  Tensor a = kiln::avg_pool2d(x);
  Tensor loss = kiln::sum(y);
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  Runner r;
  r.alloc(ctx);
  x.set<float>({1, 5, 2, 0,    //
                3, 4, 7, 7,    //
                -1, -2, 0, 0,  //
                -3, -4, 0, 0});
  r.cpu.compute(g);
  r.run(a);
  EXPECT_EQ(y.get<float>(), (std::vector<float>{5, 7, -1, 0}));
  EXPECT_EQ(a.get<float>(), (std::vector<float>{13 / 4.f, 4, -10 / 4.f, 0}));
  // Each window's gradient goes to its first maximum (row-major); ties included.
  EXPECT_EQ(g.grad(x).get<float>(),
            (std::vector<float>{0, 1, 0, 0, 0, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0}));
}

// Large enough that the kernels split work between threads (small jobs stay on
// one thread): forward values and gradients must be bit-identical for any count.
TEST(NnOps, ResultsDoNotDependOnThreadCount) {
  kiln::Context ctx;
  Tensor x = ctx.param(f32, {64, 1024}), img = ctx.param(f32, {8, 16, 32, 32});
  Tensor w = ctx.param(f32, {8, 16, 3, 3}), table = ctx.param(f32, {1000, 64});
  Tensor narrow_table = ctx.param(f32, {5000, 8});  // scatter-add splits rows, not columns
  Tensor idx = ctx.input(i32, {2048});
  kiln::SoftmaxOptions causal;
  causal.causal = true;
  kiln::Conv2dOptions co;
  co.padding[0] = co.padding[1] = 1;
  kiln::Pool2dOptions po;
  po.kernel[0] = po.kernel[1] = 3;
  po.stride[0] = po.stride[1] = 1;
  po.padding[0] = po.padding[1] = 1;
  const std::vector<Tensor> outs = {
      kiln::softmax(x, causal),           kiln::log_softmax(x.T()),
      kiln::conv2d(img, w, {}, co),       kiln::max_pool2d(img, po),
      kiln::avg_pool2d(img, po),          kiln::embedding(table, idx),
      kiln::embedding(narrow_table, idx), kiln::concat({x, x.T().narrow(0, 0, 64)}, 1),
      kiln::pad(x, {3, 5, 1, 0}),         kiln::repeat(x.narrow(1, 0, 256), {2, 1, 3})};
  Tensor loss = kiln::sum(kiln::sqr(outs[0]));
  for (size_t i = 1; i < outs.size(); ++i) loss = loss + kiln::sum(kiln::sqr(outs[i]));
  kiln::Graph g = kiln::Graph::forward(loss);
  g.backward(loss);
  Runner r;
  r.alloc(ctx);
  uint32_t state = 12345;  // small LCG: deterministic inputs in (-1, 1)
  auto fill = [&](Tensor t) {
    std::vector<float> v(size_t(t.numel()));
    for (float& e : v) e = float((state = state * 1664525u + 1013904223u) >> 8) / 8388608.0f - 1.0f;
    t.set(v);
  };
  for (Tensor t : {x, img, w, table, narrow_table}) fill(t);
  std::vector<int32_t> iv(2048);
  for (size_t i = 0; i < iv.size(); ++i) iv[i] = int32_t((i * 7919) % 1000);
  idx.set(iv);
  std::vector<std::vector<float>> first;
  for (int threads : {1, 2, 3, 4}) {
    kiln::CpuBackend cpu(threads);
    g.reset_grads();
    cpu.compute(g);
    std::vector<std::vector<float>> got;
    for (Tensor o : outs) got.push_back(o.get<float>());
    for (Tensor p : {x, img, w, table, narrow_table}) got.push_back(g.grad(p).get<float>());
    if (first.empty()) {
      first = got;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(got[i] == first[i])
          << "result " << i << " differs with " << threads << " threads";
  }
}

}  // namespace

TEST(NnOpsErrors, Attention) {
  kiln::Context ctx;
  Tensor q = ctx.input(f32, {2, 3, 8, 4}, "q");
  Tensor k = ctx.input(f32, {2, 3, 9, 4}, "k");
  Tensor v = ctx.input(f32, {2, 3, 9, 4}, "v");
  EXPECT_KILN_ERROR(kiln::attention(q, k, ctx.input(f32, {2, 3, 9, 5})), "attention", "last dim",
                    "[2, 3, 9, 5]");
  EXPECT_KILN_ERROR(kiln::attention(q, k, ctx.input(f32, {2, 3, 7, 4})), "attention", "Tk",
                    "[2, 3, 7, 4]");
  EXPECT_KILN_ERROR(kiln::attention(q, ctx.input(f32, {2, 2, 9, 4}), v), "attention",
                    "leading dims", "[2, 2, 9, 4]");
  EXPECT_KILN_ERROR(kiln::attention(q, ctx.input(f32, {3, 9, 4}), v), "attention",
                    "number of dimensions");
  EXPECT_KILN_ERROR(kiln::attention(ctx.input(i32, {2, 3, 8, 4}), k, v), "attention", "q", "i32");
  EXPECT_KILN_ERROR(kiln::attention(ctx.input(f32, {4}), ctx.input(f32, {4}), ctx.input(f32, {4})),
                    "attention", "[..., Tq, E]");
  EXPECT_KILN_ERROR(kiln::attention(q, k, v, {-1.0f, true}), "attention", "scale");
  EXPECT_KILN_ERROR(kiln::attention(q, k, Tensor()), "attention", "undefined");
  // q, k, v share one dtype (f32 or bf16); f16 is neither.
  EXPECT_KILN_ERROR(kiln::attention(q, k.to(kiln::bf16), v), "attention", "f32", "bf16",
                    "one dtype");
  EXPECT_KILN_ERROR(kiln::attention(q.to(kiln::f16), k, v), "attention", "q", "f16");
}

TEST(NnOpsErrors, Rope) {
  kiln::Context ctx;
  Tensor x = ctx.input(f32, {2, 5, 3, 8}, "x");
  Tensor c = ctx.input(f32, {5, 8}, "cos"), s = ctx.input(f32, {5, 8}, "sin");
  Tensor long_table = ctx.input(f32, {16, 8});
  EXPECT_KILN_ERROR(kiln::rope(ctx.input(f32, {5, 3, 8}, "x3"), c, s), "rope", "[B, T, H, D]",
                    "'x3'", "[5, 3, 8]");
  EXPECT_KILN_ERROR(
      kiln::rope(ctx.input(f32, {2, 5, 3, 7}), ctx.input(f32, {5, 7}), ctx.input(f32, {5, 7})),
      "rope", "even", "[2, 5, 3, 7]");
  // Whole [S, D] tables must be narrowed to the positions of x.
  EXPECT_KILN_ERROR(kiln::rope(x, long_table, long_table), "rope", "[16, 8]", "[T, D] = [5, 8]",
                    "narrow");
  EXPECT_KILN_ERROR(kiln::rope(x, c, ctx.input(f32, {5, 4})), "rope", "sin [5, 4]");
  EXPECT_KILN_ERROR(kiln::rope(ctx.input(i32, {2, 5, 3, 8}), c, s), "rope", "x", "i32");
  EXPECT_KILN_ERROR(kiln::rope(x, ctx.input(f16, {5, 8}), s), "rope", "cos", "f16");
  EXPECT_KILN_ERROR(kiln::rope(x, c, Tensor()), "rope", "undefined");
  kiln::Context other;
  EXPECT_KILN_ERROR(kiln::rope(x, c, other.input(f32, {5, 8})), "rope", "context");
  // A narrow of the long table at an offset is what a KV cache passes.
  EXPECT_NO_THROW((void)kiln::rope(x, long_table.narrow(0, 7, 5), long_table.narrow(0, 7, 5)));
}
