// CUDA backend figures: per-step overhead of plain kernel launches
// against replaying a captured CUDA graph.
//   train_batch/{fc,cnn}/{graph,plain}  one physical batch (500 samples) of
//                       kiln-mnist's model on the GPU: forward, backward, every
//                       2nd call the AdamW step, loss read back (a sync)
//   chain/{graph,plain} 200 dependent small elementwise ops on 1024 floats plus a
//                       synchronize: almost nothing but launch overhead
//   train_batch/gpt/{f32,bf16}/{dropout,nodropout}  one training step (AdamW,
//                       clipping) of kiln-gpt's model on nanoGPT's GPU recipe
//                       (6 layers, 6 heads, 384 wide, block 256, batch 64:
//                       16384 tokens); with dropout 0.2 attention is the
//                       composite (softmax, dropout), without it the fused op.
//                       KILN_CUDA_PROFILE=1 prints each backend's per-op GPU
//                       times when it is destroyed (kiln/cuda.h).
//
//   build/release/bench/bench_cuda [--benchmark_repetitions=9]
// Needs a CUDA device; without one (or in a build without CUDA) it prints why and
// exits 0, so scripts/bench.sh runs everywhere.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/opt.h"

#if KILN_HAVE_CUDA
#include "gpt_model.h"  // examples/gpt
#include "kiln/cuda.h"
#include "kiln/token_train.h"
#include "model.h"  // examples/mnist

namespace {

using namespace kiln;

// kiln-mnist's model (examples/mnist/model.h) on the GPU.
struct Mnist {
  Mnist(bool cnn, bool graphs)
      : gpu(CudaOptions{.graphs = graphs}), model(mnist::Model::build(cnn ? "cnn" : "fc", 500)) {
    const int64_t B = 500;
    Tensor x = model.images;
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = model.logits;
    cfg.model = model.net.get();
    cfg.logical_batch = 1000;
    cfg.backends = {&gpu, &cpu};  // the CPU runs what CUDA has no kernel for
    opt = std::make_unique<OptContext>(cfg);
    model.net->init(1);  // the params have memory now (the context's, on the GPU)
    std::vector<float> xs(static_cast<size_t>(x.numel()));
    for (size_t i = 0; i < xs.size(); ++i) xs[i] = float((i * 7919) % 256) / 255.0f;
    x.set(xs);
    std::vector<int32_t> ys(static_cast<size_t>(B));
    for (int64_t i = 0; i < B; ++i) ys[size_t(i)] = int32_t(i % 10);
    opt->labels().set(ys);
  }
  CudaBackend gpu;
  CpuBackend cpu;
  mnist::Model model;
  std::unique_ptr<OptContext> opt;
};

void train_batch(benchmark::State& st, bool cnn, bool graphs) {
  Mnist m(cnn, graphs);
  m.opt->train_batch();  // first run and capture outside the timing
  m.opt->train_batch();
  for (auto _ : st) m.opt->train_batch();
  st.SetItemsProcessed(st.iterations() * 500);
  const CudaBackend::Stats s = m.gpu.stats();
  st.counters["replays"] = double(s.replays);
  st.counters["eager"] = double(s.eager);
}

// kiln-gpt's model and step on the GPU (examples/gpt/main.cpp's OptConfig
// without the schedule), random tokens.
struct GptCuda {
  GptCuda(DType precision, float dropout) {
    gpt::GptConfig c;
    c.n_layer = 6;
    c.n_head = 6;
    c.n_embd = 384;
    c.block = 256;
    c.dropout = dropout;
    ctx.set_matmul_precision(precision);
    model = std::make_unique<gpt::Gpt>(ctx, c);
    model->allocate(gpu);
    model->init_gpt(1337);
    Tensor idx = ctx.input(i32, {kBatch, c.block}, "idx");
    Tensor targets = ctx.input(i32, {kBatch, c.block}, "targets");
    OptConfig oc = next_token_opt_config(*model, idx, (*model)(idx), targets, 0.1f);
    oc.clip_grad_norm = 1.0f;
    oc.backends = {&gpu, &cpu};
    opt = std::make_unique<OptContext>(oc);
    std::vector<int32_t> tok(size_t(kBatch * c.block));
    for (size_t i = 0; i < tok.size(); ++i) tok[i] = int32_t((i * 7919 + 13) % 256);
    opt->inputs().set(tok);
    std::rotate(tok.begin(), tok.begin() + 1, tok.end());
    opt->labels().set(tok);
  }
  static constexpr int64_t kBatch = 64;
  CudaBackend gpu;
  CpuBackend cpu;
  Context ctx;
  std::unique_ptr<gpt::Gpt> model;
  std::unique_ptr<OptContext> opt;
};

void train_batch_gpt(benchmark::State& st, DType precision, float dropout) {
  GptCuda m(precision, dropout);
  m.opt->train_batch();  // first run and capture outside the timing
  m.opt->train_batch();
  for (auto _ : st) m.opt->train_batch();
  st.SetItemsProcessed(st.iterations() * GptCuda::kBatch * 256);  // tokens
  st.counters["replays"] = double(m.gpu.stats().replays);
}

void chain(benchmark::State& st, bool graphs) {
  CudaBackend gpu(CudaOptions{.graphs = graphs});
  Context ctx;
  Tensor x = ctx.input(f32, {1024}, "x");
  Tensor y = x;
  for (int i = 0; i < 200; ++i) y = i % 2 ? scale(y, 0.5f, 1.0f) : relu(y);
  Graph g = Graph::forward(y);
  auto buf = allocate_tensors(ctx, gpu);
  for (auto _ : st) {
    gpu.compute(g);
    gpu.synchronize();
  }
  st.counters["nodes"] = double(g.size());
}

}  // namespace

int main(int argc, char** argv) {
  if (kiln::cuda_device_count() == 0) {
    std::printf("bench_cuda: skipped: %s\n", kiln::cuda_unavailable_reason().c_str());
    return 0;
  }
  std::printf("bench_cuda: %s\n", kiln::cuda_description(0).c_str());
  for (bool cnn : {false, true})
    for (bool graphs : {true, false})
      benchmark::RegisterBenchmark(
          (std::string("train_batch/") + (cnn ? "cnn" : "fc") + (graphs ? "/graph" : "/plain"))
              .c_str(),
          [=](benchmark::State& st) { train_batch(st, cnn, graphs); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (DType p : {f32, bf16})
    for (float dropout : {0.2f, 0.0f})
      benchmark::RegisterBenchmark((std::string("train_batch/gpt/") + dtype_name(p) +
                                    (dropout > 0 ? "/dropout" : "/nodropout"))
                                       .c_str(),
                                   [=](benchmark::State& st) { train_batch_gpt(st, p, dropout); })
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
  for (bool graphs : {true, false})
    benchmark::RegisterBenchmark(graphs ? "chain/graph" : "chain/plain",
                                 [=](benchmark::State& st) { chain(st, graphs); })
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

#else

int main() {
  std::printf(
      "bench_cuda: skipped: kiln was built without CUDA (KILN_CUDA=OFF or nvcc not found)\n");
  return 0;
}

#endif
