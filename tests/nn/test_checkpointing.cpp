// Gradient checkpointing: the same gradients (<= 1e-6 relative) with and
// without checkpoints on an MLP, a small CNN and a small GPT built from kiln::nn
// blocks, with less planned memory; dropout inside a recomputed segment draws
// the same mask; OptContext's one option with gradient accumulation.
#include <algorithm>
#include <functional>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/opt.h"
#include "nn_test_util.h"

namespace kiln::test {
namespace {

// Gradients of `params` and the planned buffer of one graph.
struct Run {
  std::vector<std::vector<float>> grads;
  size_t planned = 0;
  Graph graph;
};

// Two graphs of one model: `build(false)` plain, `build(true)` with checkpoints
// (marked by the builder, or by auto_checkpoint when `automatic`). Inputs are
// filled by `fill` once both are allocated, then both run.
struct Pair {
  Run plain, ckpt;
};

Pair run_pair(Context& ctx, const std::vector<Tensor>& params,
              const std::function<Tensor(bool)>& build, const std::function<void()>& fill,
              bool automatic = false) {
  Pair out;
  CpuBackend cpu(1);
  std::vector<std::unique_ptr<GraphAllocator>> allocs;
  for (bool ck : {false, true}) {
    Run& r = ck ? out.ckpt : out.plain;
    Tensor loss = build(ck);
    r.graph = Graph::forward(loss);
    if (ck && automatic) EXPECT_FALSE(auto_checkpoint(r.graph).empty());
    r.graph.backward(loss);
    allocs.push_back(std::make_unique<GraphAllocator>(cpu.buffer_type()));
    allocs.back()->alloc(r.graph);
    r.planned = allocs.back()->plan().buffer_size;
  }
  fill();
  for (Run* r : {&out.plain, &out.ckpt}) {
    cpu.compute(r->graph);
    for (const Tensor& p : params) r->grads.push_back(r->graph.grad(p).get<float>());
  }
  return out;
}

// Every gradient equal within `rel` of the larger magnitude (and some non-zero).
void expect_same_grads(const Pair& p, const std::vector<Tensor>& params, double rel = 1e-6) {
  ASSERT_EQ(p.plain.grads.size(), p.ckpt.grads.size());
  double largest = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const std::vector<float>&a = p.plain.grads[k], &b = p.ckpt.grads[k];
    ASSERT_EQ(a.size(), b.size());
    int bad = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      largest = std::max(largest, double(std::fabs(a[i])));
      const double tol = rel * std::max(std::fabs(a[i]), 1e-30f);
      if (!(std::fabs(double(a[i]) - b[i]) <= tol) && bad++ < 3)
        ADD_FAILURE() << params[k].name() << "[" << i << "]: " << a[i] << " vs " << b[i];
    }
  }
  EXPECT_GT(largest, 0.0);
}

double max_abs(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, std::fabs(double(a[i]) - b[i]));
  return d;
}

// Backward nodes that recompute a forward op.
size_t count_in_backward(const Graph& g, Op op) {
  size_t n = 0;
  for (size_t k = g.n_forward(); k < g.size(); ++k) n += g.nodes()[k]->op == op;
  return n;
}

nn::Sequential& deep_mlp(nn::Sequential& seq, int depth, int64_t in, int64_t hidden, int64_t out) {
  for (int i = 0; i < depth; ++i) {
    seq.push_back<nn::Linear>(i == 0 ? in : hidden, hidden);
    seq.push_back<nn::ReLU>();
  }
  seq.push_back<nn::Linear>(hidden, out);
  return seq;
}

TEST(Checkpointing, MlpSameGradientsAutomaticLessMemory) {
  Context ctx;
  CpuBackend cpu(1);
  nn::Sequential model(ctx);
  deep_mlp(model, 32, 32, 64, 4);
  model.allocate(cpu);
  model.init(1);
  // Batch 256: activations (64 KiB each) outweigh the gradient accumulators
  // (16 KiB each), which the planned buffer holds too.
  Tensor x = ctx.input(f32, {256, 32}, "x"), t = ctx.input(f32, {256, 4}, "t");
  auto build = [&](bool) { return mse_loss(model(x), t); };
  auto fill = [&] {
    x.set(random_values(size_t(x.numel()), 2));
    t.set(random_values(size_t(t.numel()), 3));
  };
  Pair p = run_pair(ctx, model.parameters(), build, fill, /*automatic=*/true);
  expect_same_grads(p, model.parameters());
  EXPECT_GT(count_in_backward(p.ckpt.graph, Op::MATMUL),
            count_in_backward(p.plain.graph, Op::MATMUL))
      << "nothing was recomputed";
  EXPECT_LT(double(p.ckpt.planned), 0.6 * double(p.plain.planned))
      << p.ckpt.planned << " vs " << p.plain.planned;
}

TEST(Checkpointing, SmallCnnSameGradientsWithMarkedModules) {
  Context ctx;
  CpuBackend cpu(1);
  nn::Sequential model(ctx);
  Conv2dOptions pad1;
  pad1.padding[0] = pad1.padding[1] = 1;
  model.push_back<nn::Conv2d>(1, 4, 3, pad1);
  model.push_back<nn::ReLU>();
  model.push_back<nn::MaxPool2d>();
  model.push_back<nn::Conv2d>(4, 8, 3, pad1);
  model.push_back<nn::ReLU>();
  model.push_back<nn::MaxPool2d>();
  model.push_back<nn::Flatten>();
  model.push_back<nn::Linear>(8 * 4 * 4, 10);
  model.allocate(cpu);
  model.init(4);
  Tensor x = ctx.input(f32, {8, 1, 16, 16}, "x"), y = ctx.input(i32, {8}, "y");
  auto build = [&](bool ck) {
    model[2].set_checkpoint(ck);  // after the first pooling
    model[5].set_checkpoint(ck);  // after the second
    return cross_entropy(model(x), y);
  };
  auto fill = [&] {
    x.set(random_values(size_t(x.numel()), 5));
    y.set(std::vector<int32_t>{0, 3, 9, 1, 4, 4, 7, 2});
  };
  Pair p = run_pair(ctx, model.parameters(), build, fill);
  expect_same_grads(p, model.parameters());
  EXPECT_GT(count_in_backward(p.ckpt.graph, Op::CONV2D), 0u);
  EXPECT_EQ(count_in_backward(p.plain.graph, Op::CONV2D), 0u);
  EXPECT_LT(p.ckpt.planned, p.plain.planned);
}

struct Gpt : nn::Module {
  nn::Embedding& wte;
  nn::Embedding& wpe;
  nn::Sequential& blocks;
  nn::LayerNorm& ln_f;
  nn::Linear& lm_head;
  Tensor pos;
  Gpt(Context& ctx, int64_t vocab, int64_t T, int64_t dim, int n_layer, float dropout)
      : Module(ctx),
        wte(add<nn::Embedding>("wte", vocab, dim)),
        wpe(add<nn::Embedding>("wpe", T, dim)),
        blocks(add<nn::Sequential>("blocks")),
        ln_f(add<nn::LayerNorm>("ln_f", dim)),
        lm_head(add<nn::Linear>("lm_head", dim, vocab, false)),
        pos(ctx.input(i32, {T}, "pos")) {
    for (int i = 0; i < n_layer; ++i) blocks.push_back<nn::TransformerBlock>(dim, 2, dropout);
  }
  Tensor forward(Tensor idx) override {
    Tensor h = blocks(wte(idx) + wpe(pos));
    return lm_head(ln_f(h)).reshape({idx.numel(), lm_head.out_features()});
  }
};

TEST(Checkpointing, GptWithDropoutSameGradientsEveryBlockMarked) {
  constexpr int64_t B = 2, T = 8, V = 13;
  Context ctx;
  CpuBackend cpu(1);
  Gpt model(ctx, V, T, 16, 4, /*dropout=*/0.2f);
  model.allocate(cpu);
  model.init(6);
  Tensor idx = ctx.input(i32, {B, T}, "idx"), y = ctx.input(i32, {B * T}, "y");
  auto build = [&](bool ck) {
    for (size_t i = 0; i < model.blocks.size(); ++i) model.blocks[i].set_checkpoint(ck);
    return cross_entropy(model(idx), y);
  };
  auto fill = [&] {
    std::vector<int32_t> tok(B * T), pos(T), lab(B * T);
    for (int64_t i = 0; i < B * T; ++i) {
      tok[size_t(i)] = int32_t((i * 7 + 3) % V);
      lab[size_t(i)] = int32_t((i * 5 + 1) % V);
    }
    for (int64_t i = 0; i < T; ++i) pos[size_t(i)] = int32_t(i);
    idx.set(tok);
    y.set(lab);
    model.pos.set(pos);
    model.set_dropout_step(3);
  };
  Pair p = run_pair(ctx, model.parameters(), build, fill);
  expect_same_grads(p, model.parameters());
  // Dropout masks were drawn again in backward (and matched: same gradients).
  EXPECT_GT(count_in_backward(p.ckpt.graph, Op::RAND_MASK), 0u);
  EXPECT_LT(p.ckpt.planned, p.plain.planned);
}

// The mask drawn again in a recomputed segment is the forward pass's: the
// gradients equal the plain graph's, and they do depend on the mask (another
// step seed changes them, so equality is not trivial).
TEST(Checkpointing, DropoutInRecomputedSegmentDrawsTheSameMask) {
  Context ctx;
  CpuBackend cpu(1);
  nn::Sequential model(ctx);
  model.push_back<nn::Linear>(8, 32);
  model.push_back<nn::Dropout>(0.5f);
  model.push_back<nn::Linear>(32, 32);
  model.push_back<nn::ReLU>();
  model.push_back<nn::Linear>(32, 2);
  model.allocate(cpu);
  model.init(7);
  Tensor x = ctx.input(f32, {16, 8}, "x"), t = ctx.input(f32, {16, 2}, "t");
  auto build = [&](bool ck) {
    model[3].set_checkpoint(ck);  // Linear, Dropout, Linear are recomputed
    return mse_loss(model(x), t);
  };
  int32_t step = 11;
  auto fill = [&] {
    x.set(random_values(size_t(x.numel()), 8));
    t.set(random_values(size_t(t.numel()), 9));
    model.set_dropout_step(step);
  };
  Pair p = run_pair(ctx, model.parameters(), build, fill);
  expect_same_grads(p, model.parameters());
  EXPECT_EQ(count_in_backward(p.ckpt.graph, Op::RAND_MASK), 1u);
  EXPECT_EQ(count_in_backward(p.plain.graph, Op::RAND_MASK), 0u);
  step = 12;
  Pair q = run_pair(ctx, model.parameters(), build, fill);
  EXPECT_GT(max_abs(q.plain.grads[0], p.plain.grads[0]), 1e-4) << "the mask does not matter";
}

TEST(Checkpointing, AutoCheckpointPicksAboutSqrtOfTheCutPoints) {
  Context ctx;
  nn::Sequential model(ctx);
  deep_mlp(model, 32, 8, 8, 2);  // cut points: each Linear and ReLU output
  Tensor x = ctx.input(f32, {4, 8}, "x");
  Graph g = Graph::forward(sum(model(x)));
  const std::vector<Tensor> picked = auto_checkpoint(g);
  // 32 * 2 (+ the matmul/bias split of each Linear) candidates: about 8 to 12 segments.
  EXPECT_GE(picked.size(), 6u);
  EXPECT_LE(picked.size(), 13u);
  for (const Tensor& c : picked) EXPECT_TRUE(c.has_flag(kFlagCheckpoint));
  // Spread evenly: every picked tensor is a distinct node, in forward order.
  std::vector<size_t> at;
  for (const Tensor& c : picked)
    for (size_t k = 0; k < g.n_forward(); ++k)
      if (g.nodes()[k] == c.node()) at.push_back(k);
  ASSERT_EQ(at.size(), picked.size());
  EXPECT_TRUE(std::is_sorted(at.begin(), at.end()));
  // A graph too small to split gets none.
  Tensor z = ctx.input(f32, {3}, "z");
  Graph tiny = Graph::forward(sum(z));
  EXPECT_TRUE(auto_checkpoint(tiny).empty());
}

// OptContext's one option, with 2 physical batches per step: the same params
// after three steps, less planned memory.
TEST(Checkpointing, OptContextOptionWithGradientAccumulation) {
  struct Trained {
    std::vector<std::vector<float>> params;
    size_t planned;
  };
  auto train = [](bool checkpointing) {
    Context ctx;
    nn::Sequential model(ctx);
    deep_mlp(model, 12, 16, 64, 3);
    Tensor x = ctx.input(f32, {32, 16}, "x");
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = model(x);
    cfg.loss = LossKind::mse;
    cfg.model = &model;
    cfg.logical_batch = 64;
    cfg.n_threads = 1;
    cfg.checkpointing = checkpointing;
    OptContext opt(std::move(cfg));
    model.init(9);
    for (int b = 0; b < 6; ++b) {
      x.set(random_values(size_t(x.numel()), 100 + b));
      opt.labels().set(random_values(size_t(opt.labels().numel()), 200 + b));
      opt.train_batch();
    }
    EXPECT_EQ(opt.step(), 3);
    Trained r{{}, opt.memory_plan().buffer_size};
    for (const Tensor& p : model.parameters()) r.params.push_back(p.get<float>());
    return r;
  };
  const Trained plain = train(false), ckpt = train(true);
  ASSERT_EQ(plain.params.size(), ckpt.params.size());
  for (size_t k = 0; k < plain.params.size(); ++k)
    for (size_t i = 0; i < plain.params[k].size(); ++i)
      ASSERT_NEAR(ckpt.params[k][i], plain.params[k][i],
                  1e-6 * std::max(1.0f, std::fabs(plain.params[k][i])))
          << k << " " << i;
  EXPECT_LT(double(ckpt.planned), 0.8 * double(plain.planned))
      << ckpt.planned << " vs " << plain.planned;
}

}  // namespace
}  // namespace kiln::test
