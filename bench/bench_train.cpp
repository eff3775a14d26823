// Training-loop figures (docs/design.md, principle 7: "per-step overhead is a
// benchmark figure"):
//   train_batch/{fc,cnn}  one physical batch of kiln-mnist's fc or cnn model (500
//                       samples: forward, backward, every 2nd call the AdamW step)
//   eval_batch/{fc,cnn} forward only
//   get_batch/mnist     copying 500 u8 28x28 samples into the f32 input
//   step_overhead/tiny  a whole logical step of a tiny model (2-4-2, batch 1):
//                       nearly all of it is per-step overhead (thread-pool
//                       dispatch and barriers, hyper-parameter upload, gradient
//                       reset, loss read-back), next to
//   graph_compute/tiny  the same model's graph run by Backend::compute alone
//   profile/{fc,cnn}    forward and backward run node by node: counters give the
//                       time per op (ms per physical batch; KILN_PROFILE_SHAPES=1
//                       splits them by output shape)
//   train_batch/gpt     one training step of kiln-gpt's default model (batch 12,
//                       block 64: 768 tokens; examples/gpt), and
//   profile/gpt         its forward and backward node by node, as profile/fc
//
//   build/release/bench/bench_train [--benchmark_filter=fc] [--benchmark_repetitions=9]
// Threads: KILN_BENCH_THREADS (default 2, the setting). KILN_BENCH_PRECISION=bf16:
// the models under the bf16 precision policy (as kiln-mnist/kiln-gpt --precision bf16).
// KILN_BENCH_NO_PASSES=fuse_residual,...: the default graph passes but these.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpt_model.h"  // examples/gpt
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"
#include "kiln/opt.h"
#include "model.h"  // examples/mnist

namespace {

using namespace kiln;

// On a shared machine the minimum over repetitions is the figure to quote
// (--benchmark_repetitions=N adds it next to mean and median).
double min_of(const std::vector<double>& v) {
  return v.empty() ? 0.0 : *std::min_element(v.begin(), v.end());
}

// KILN_BENCH_PRECISION=bf16: the models' --precision bf16 (matmuls, conv2d and
// attention on bf16 operands, f32 master weights).
DType bench_precision() {
  const char* p = std::getenv("KILN_BENCH_PRECISION");
  return p && std::string(p) == "bf16" ? bf16 : f32;
}

// KILN_BENCH_NO_PASSES=fuse_residual,...: the OptContexts run the default
// graph passes but these (kiln/graph_passes.h names), to time a pass on and
// off in one binary. Unset: the defaults.
GraphPasses bench_passes() {
  GraphPasses s = GraphPasses::defaults(GraphKind::training);
  const char* e = std::getenv("KILN_BENCH_NO_PASSES");
  if (!e || !*e) return s;
  const GraphPasses off = GraphPasses::parse(e);
  for (const GraphPassInfo& i : graph_pass_table())
    if (off.has(i.pass)) s = s.without(i.pass);
  return s;
}

int bench_threads() {
  const char* e = std::getenv("KILN_BENCH_THREADS");
  return e && *e ? std::atoi(e) : 2;
}

// kiln-mnist's fc or cnn model (examples/mnist/model.h, the one definition the
// example, the benchmarks and the CUDA tests share) with random inputs and labels.
struct Mnist {
  explicit Mnist(bool cnn, int64_t B = 500, int64_t logical = 1000)
      : model(mnist::Model::build(cnn ? "cnn" : "fc", B, bench_precision())), x(model.images) {
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = model.logits;
    cfg.model = model.net.get();
    cfg.logical_batch = logical;
    cfg.n_threads = bench_threads();
    cfg.passes = bench_passes();
    opt = std::make_unique<OptContext>(cfg);
    model.net->init(1);  // the params have memory now (the context's)
    std::vector<float> xs(size_t(x.numel()));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = float((i * 7919) % 256) / 255.0f;
    x.set(xs);
    std::vector<int32_t> ys(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) ys[size_t(i)] = int32_t(i % 10);
    opt->labels().set(ys);
  }
  mnist::Model model;
  Tensor x;
  std::unique_ptr<OptContext> opt;
};

void train_batch(benchmark::State& st, bool cnn) {
  Mnist m(cnn);
  for (auto _ : st) m.opt->train_batch();
  st.SetItemsProcessed(st.iterations() * 500);
}
BENCHMARK_CAPTURE(train_batch, fc, false)
    ->Name("train_batch/fc")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);
BENCHMARK_CAPTURE(train_batch, cnn, true)
    ->Name("train_batch/cnn")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

void eval_batch(benchmark::State& st, bool cnn) {
  Mnist m(cnn);
  for (auto _ : st) m.opt->eval_batch();
  st.SetItemsProcessed(st.iterations() * 500);
}
BENCHMARK_CAPTURE(eval_batch, fc, false)
    ->Name("eval_batch/fc")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);
BENCHMARK_CAPTURE(eval_batch, cnn, true)
    ->Name("eval_batch/cnn")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

void get_batch_mnist(benchmark::State& st) {
  Dataset ds(60000, {28, 28}, DataType::u8, {}, DataType::i32, 10);
  auto px = ds.data<uint8_t>();
  for (size_t i = 0; i < px.size(); ++i) px[i] = uint8_t(i * 31);
  ds.shuffle(1);
  Context ctx;
  Tensor x = ctx.input(f32, {500, 784}), y = ctx.input(i32, {500});
  CpuBackend cpu(1);
  auto buf = allocate_tensors(ctx, cpu);
  int64_t b = 0;
  for (auto _ : st) ds.get_batch(x, y, b++ % 120);
  st.SetItemsProcessed(st.iterations() * 500);
}
BENCHMARK(get_batch_mnist)
    ->Name("get_batch/mnist")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

struct Tiny {
  Tiny() {
    x = ctx.input(f32, {1, 2}, "x");
    Tensor w1 = ctx.param(f32, {2, 4}, "w1"), b1 = ctx.param(f32, {4}, "b1");
    Tensor w2 = ctx.param(f32, {4, 2}, "w2"), b2 = ctx.param(f32, {2}, "b2");
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = matmul(tanh(matmul(x, w1) + b1), w2) + b2;
    cfg.n_threads = bench_threads();
    cfg.passes = bench_passes();
    opt = std::make_unique<OptContext>(cfg);
    xavier_uniform(w1, 2, 4, 1);
    xavier_uniform(w2, 4, 2, 2);
    x.set({0.5f, -0.25f});
    opt->labels().set(std::vector<int32_t>{1});
  }
  Context ctx;
  Tensor x;
  std::unique_ptr<OptContext> opt;
};

void step_overhead_tiny(benchmark::State& st) {
  Tiny m;
  for (auto _ : st) m.opt->train_batch();
  st.counters["nodes"] = double(m.opt->graph().size());
}
BENCHMARK(step_overhead_tiny)
    ->Name("step_overhead/tiny")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

void graph_compute_tiny(benchmark::State& st) {
  Tiny m;
  for (auto _ : st) m.opt->backend().compute(m.opt->graph());
  st.counters["nodes"] = double(m.opt->graph().size());
}
BENCHMARK(graph_compute_tiny)
    ->Name("graph_compute/tiny")
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

// kiln-gpt's default model and training step (examples/gpt/main.cpp's
// OptConfig without the schedule), random tokens.
struct GptBench {
  GptBench() : cpu(bench_threads()) {
    gpt::GptConfig c;
    ctx.set_matmul_precision(bench_precision());  // before the model is built
    model = std::make_unique<gpt::Gpt>(ctx, c);
    model->allocate(cpu);
    model->init_gpt(1337);
    const int64_t B = 12, T = c.block, V = c.vocab;
    Tensor idx = ctx.input(i32, {B, T}, "idx"), targets = ctx.input(i32, {B, T}, "targets");
    Tensor logits = (*model)(idx);
    OptConfig oc;
    oc.inputs = idx;
    oc.outputs = logits;
    oc.labels = targets;
    oc.loss = LossKind::user;
    oc.user_loss = cross_entropy(logits.reshape({B * T, V}), targets.reshape({B * T}));
    oc.groups = weight_decay_groups(*model, 0.1f);
    oc.model = model.get();
    oc.clip_grad_norm = 1.0f;
    oc.backends = {&cpu};
    oc.passes = bench_passes();
    opt = std::make_unique<OptContext>(oc);
    std::vector<int32_t> tok(size_t(B * T));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7919 + 13) % 256);
    opt->inputs().set(tok);
    std::rotate(tok.begin(), tok.begin() + 1, tok.end());
    opt->labels().set(tok);
  }
  Context ctx;
  CpuBackend cpu;
  std::unique_ptr<gpt::Gpt> model;
  std::unique_ptr<OptContext> opt;
};

void train_batch_gpt(benchmark::State& st) {
  GptBench m;
  for (auto _ : st) m.opt->train_batch();
  st.SetItemsProcessed(st.iterations() * 768);  // tokens
}
BENCHMARK(train_batch_gpt)
    ->Name("train_batch/gpt")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of);

// Node by node (one pool dispatch each, so small nodes read a little high).
template <class M>
void profile_nodes(benchmark::State& st, M& m) {
  const auto& nodes = m.opt->graph().nodes();
  const size_t nf = m.opt->n_forward_nodes(), nb = m.opt->n_backward_nodes();
  std::map<std::string, double> ms;
  using Clock = std::chrono::steady_clock;
  const bool per_shape =
      std::getenv("KILN_PROFILE_SHAPES") != nullptr;  // one counter per op and shape
  for (auto _ : st) {
    // Forward and backward only: the optimizer nodes would run without the
    // per-step values the training loop writes, and turn the weights to NaN.
    for (size_t i = 0; i < nb; ++i) {
      const auto t0 = Clock::now();
      m.opt->backend().compute(std::span<TensorNode* const>(&nodes[i], 1));
      const double dt = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
      std::string key = std::string(i < nf ? "f." : "b.") + op_name(nodes[i]->op);
      if (per_shape) key += nodes[i]->shape.str();
      ms[key] += dt;
    }
  }
  m.opt->reset_grads();
  for (auto& [k, v] : ms) st.counters[k] = v / double(st.iterations());
}
void profile(benchmark::State& st, bool cnn) {
  Mnist m(cnn);
  profile_nodes(st, m);
}
void profile_gpt(benchmark::State& st) {
  GptBench m;
  profile_nodes(st, m);
}
BENCHMARK(profile_gpt)
    ->Name("profile/gpt")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(20)
    ->ComputeStatistics("min", min_of);
BENCHMARK_CAPTURE(profile, fc, false)
    ->Name("profile/fc")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(20)
    ->ComputeStatistics("min", min_of);
BENCHMARK_CAPTURE(profile, cnn, true)
    ->Name("profile/cnn")
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->Iterations(20)
    ->ComputeStatistics("min", min_of);

}  // namespace

BENCHMARK_MAIN();
