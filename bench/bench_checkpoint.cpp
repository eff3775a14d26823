// Gradient checkpointing: planned memory and time of a training step
// with and without OptConfig::checkpointing, for stacks of GPT blocks
// (nn::TransformerBlock; batch 4, 128 tokens, width 128, 4 heads, MSE against a
// target) of depth 8, 16 and 32, and a deep MLP (32 Linear+ReLU layers of 512,
// batch 256).
//
//   build/<dir>/bench/bench_checkpoint [steps]   # a markdown table on stdout
//
// "planned" is OptContext::memory_plan().buffer_size: the graph's intermediates
// (activations and backward temporaries) in one planned buffer. Params,
// gradients, optimizer state and inputs sit in the static buffer, the same with
// and without checkpointing, and are left out. Memory figures are exact and
// deterministic; times are the median of `steps` optimizer steps (default 21)
// after one warm-up step, on 2 threads, the plain and the checkpointed step
// alternating so that both see the same load.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

struct Figures {
  size_t planned = 0;
  size_t checkpoints = 0;
  double ms_per_step = 0;  // median
};

using MakeModel = std::function<nn::Module*(Context&, std::unique_ptr<nn::Module>&)>;

// One model in its own context with its training step, with or without
// checkpointing.
struct Setup {
  Context ctx;
  std::unique_ptr<nn::Module> model;
  std::unique_ptr<OptContext> opt;
  Figures figures;
  std::vector<double> step_ms;

  Setup(const MakeModel& make, const Shape& in_shape, bool checkpointing) {
    nn::Module* m = make(ctx, model);
    Tensor x = ctx.input(f32, in_shape, "x");
    OptConfig cfg;
    cfg.inputs = x;
    cfg.outputs = (*m)(x);
    cfg.loss = LossKind::mse;
    cfg.model = m;
    cfg.n_threads = 2;
    cfg.checkpointing = checkpointing;
    opt = std::make_unique<OptContext>(std::move(cfg));
    m->init(1);
    std::vector<float> xv(size_t(x.numel())), yv(size_t(opt->labels().numel()));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = float((i * 37) % 101) / 101.0f - 0.5f;
    for (size_t i = 0; i < yv.size(); ++i) yv[i] = float((i * 53) % 97) / 97.0f - 0.5f;
    x.set(xv);
    opt->labels().set(yv);
    figures.planned = opt->memory_plan().buffer_size;
    for (size_t k = 0; k < opt->n_forward_nodes(); ++k)
      figures.checkpoints += (opt->graph().nodes()[k]->flags & kFlagCheckpoint) != 0;
    opt->train_batch();  // warm-up
  }

  void timed_step() {
    const auto t0 = std::chrono::steady_clock::now();
    opt->train_batch();
    const auto t1 = std::chrono::steady_clock::now();
    step_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }

  void finish() {
    std::sort(step_ms.begin(), step_ms.end());
    figures.ms_per_step = step_ms[step_ms.size() / 2];
  }
};

std::string mib(size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.1f", double(bytes) / (1024.0 * 1024.0));
  return s;
}

// The two setups alternate step by step, so both see the same machine load.
void row(const char* name, int depth, const MakeModel& make, const Shape& in, int steps) {
  Setup plain_setup(make, in, false), ck_setup(make, in, true);
  for (int s = 0; s < steps; ++s) {
    plain_setup.timed_step();
    ck_setup.timed_step();
  }
  plain_setup.finish();
  ck_setup.finish();
  const Figures& plain = plain_setup.figures;
  const Figures& ck = ck_setup.figures;
  std::printf("| %s | %d | %s | %s | %.3f | %zu | %.1f | %.1f | %+.0f%% |\n", name, depth,
              mib(plain.planned).c_str(), mib(ck.planned).c_str(),
              double(ck.planned) / double(plain.planned), ck.checkpoints, plain.ms_per_step,
              ck.ms_per_step, 100.0 * (ck.ms_per_step / plain.ms_per_step - 1.0));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 21;
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  std::printf("load average %.2f, %d timed steps per row\n\n", load, steps);
  std::printf(
      "| model | depth | planned MiB | with checkpointing | ratio | checkpoints | ms/step | "
      "ms/step ckpt | time overhead |\n|---|---|---|---|---|---|---|---|---|\n");
  constexpr int64_t B = 4, T = 128, D = 128, H = 4;
  for (int depth : {8, 16, 32}) {
    auto gpt = [=](Context& ctx, std::unique_ptr<nn::Module>& owner) {
      auto seq = std::make_unique<nn::Sequential>(ctx);
      for (int i = 0; i < depth; ++i) seq->push_back<nn::TransformerBlock>(D, H);
      owner = std::move(seq);
      return owner.get();
    };
    row("GPT blocks", depth, gpt, {B, T, D}, steps);
  }
  auto mlp = [](Context& ctx, std::unique_ptr<nn::Module>& owner) {
    auto seq = std::make_unique<nn::Sequential>(ctx);
    for (int i = 0; i < 32; ++i) {
      seq->push_back<nn::Linear>(512, 512);
      seq->push_back<nn::ReLU>();
    }
    owner = std::move(seq);
    return owner.get();
  };
  row("MLP 512", 32, mlp, {256, 512}, steps);
  return 0;
}
