// Two pre-LN transformer blocks (width 64, 4 heads, every Linear with a bias)
// trained three steps by an OptContext on the CPU: the workload of the graph
// rewrite passes' tests, each of which trains with its pass and without it
// (OptConfig::passes) and compares the runs.
#pragma once
#include <functional>
#include <initializer_list>
#include <optional>
#include <vector>

#include "common/random_values.h"
#include "kiln/kiln.h"

namespace kiln_test {

// The passes an OptContext runs by default on a training graph, but `off`.
inline kiln::GraphPasses training_passes_without(std::initializer_list<kiln::GraphPass> off) {
  kiln::GraphPasses s = kiln::GraphPasses::defaults(kiln::GraphKind::training);
  for (kiln::GraphPass p : off) s = s.without(p);
  return s;
}

struct TwoBlockRun {
  std::vector<double> losses;              // of the three steps
  std::vector<std::vector<float>> params;  // after them
};

// `passes` is OptConfig::passes (nullopt: the defaults); `inspect` sees the
// program once it is built.
inline TwoBlockRun train_two_blocks(kiln::DType precision, int threads,
                                    std::optional<kiln::GraphPasses> passes,
                                    const std::function<void(const kiln::Graph&)>& inspect) {
  using namespace kiln;
  Context ctx;
  ctx.set_matmul_precision(precision);
  nn::Sequential net(ctx);
  net.push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
  net.push_back<nn::TransformerBlock>(64, 4, 0.0f, true);
  Tensor x = ctx.input(f32, {4, 16, 64}, "x");
  OptConfig cfg;
  cfg.inputs = x;
  cfg.outputs = net.forward(x);
  cfg.loss = LossKind::mse;
  cfg.model = &net;
  cfg.n_threads = threads;
  cfg.passes = passes;
  OptContext opt(cfg);
  inspect(opt.graph());
  uint32_t seed = 10;
  for (Tensor p : net.parameters()) p.set(uniform_floats(size_t(p.numel()), seed++));
  x.set(uniform_floats(size_t(x.numel()), 1));
  opt.labels().set(uniform_floats(size_t(opt.labels().numel()), 2));
  TwoBlockRun r;
  for (int step = 0; step < 3; ++step) r.losses.push_back(opt.train_batch());
  for (Tensor p : net.parameters()) r.params.push_back(p.get<float>());
  return r;
}

}  // namespace kiln_test
