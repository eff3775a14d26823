// Two pre-LN transformer blocks (width 64, 4 heads, every Linear with a bias)
// trained three steps by an OptContext on the CPU: the workload of the graph
// rewrite passes' tests, each of which trains with its pass and with the
// pass's switch off and compares the runs bit for bit.
#pragma once
#include <cstdlib>
#include <functional>
#include <optional>
#include <vector>

#include "common/random_values.h"
#include "kiln/kiln.h"

namespace kiln_test {

// Sets a rewrite's switch (e.g. "KILN_BF16_GELU_INPUTS") to 0 for its
// lifetime: for a test comparing two runs bit for bit whose other pass would
// apply in one run only and change values.
struct EnvOff {
  const char* name;
  explicit EnvOff(const char* n) : name(n) { setenv(name, "0", 1); }
  ~EnvOff() { unsetenv(name); }
  EnvOff(const EnvOff&) = delete;
  EnvOff& operator=(const EnvOff&) = delete;
};

struct TwoBlockRun {
  std::vector<double> losses;              // of the three steps
  std::vector<std::vector<float>> params;  // after them
};

// `disable_env` (e.g. "KILN_FUSE_BIAS") is set to 0 while the OptContext is
// built, or nothing when null; `inspect` sees its program once it is built.
inline TwoBlockRun train_two_blocks(kiln::DType precision, int threads, const char* disable_env,
                                    const std::function<void(const kiln::Graph&)>& inspect) {
  using namespace kiln;
  std::optional<EnvOff> off;
  if (disable_env) off.emplace(disable_env);
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
  OptContext opt(cfg);
  off.reset();
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
