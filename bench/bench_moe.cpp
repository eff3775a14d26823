// Decoding one token through mixture-of-experts feed-forward layers
// (kiln::nn::MoeFeedForward: 8 experts, top-2, SwiGLU, Qwen3-MoE's widths
// hidden 2048 / expert 768) against dense SwiGLU layers of the same total
// size (intermediate 8 x 768), both timed in the same run, alternately, so
// the ratio holds on a loaded machine. A decode step is memory-bound: the MoE
// layer reads the router and 2 of its 8 experts, the dense one all its
// weights, so the ideal ratio is a little under 4.
//
//   build/release/bench/bench_moe [layers=4] [steps=30] [threads=2]   (f32 weights)
//
// Prints the load average, each model's ms per token, tokens/s and GB/s of
// weights read (mean and best step), and the tokens/s ratios (MoE / dense).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/nn/moe.h"

using namespace kiln;

namespace {

constexpr int64_t kHidden = 2048, kExpert = 768, kExperts = 8, kTopK = 2;

// A dense SwiGLU feed-forward: down(silu(gate x) * up x).
class DenseFfn : public nn::Module {
 public:
  DenseFfn(Context& ctx, int64_t h, int64_t i)
      : Module(ctx),
        gate(add<nn::Linear>("gate", h, i, false)),
        up(add<nn::Linear>("up", h, i, false)),
        down(add<nn::Linear>("down", i, h, false)) {}
  Tensor forward(Tensor x) override { return down(silu(gate(x)) * up(x)); }
  nn::Linear& gate;
  nn::Linear& up;
  nn::Linear& down;
};

struct Model {
  Context ctx;
  std::vector<std::unique_ptr<nn::Module>> layers;
  Tensor x, y;
  std::unique_ptr<Graph> g;
  std::unique_ptr<Buffer> buf;
  double bytes_per_token = 0;  // weights a token reads
};

// `layers` residual feed-forward layers on a [1, hidden] token.
void build(Model& m, bool moe, int layers, CpuBackend& cpu) {
  m.x = m.ctx.input(f32, {1, kHidden}, "x");
  Tensor h = m.x;
  for (int l = 0; l < layers; ++l) {
    if (moe) {
      auto f = std::make_unique<nn::MoeFeedForward>(
          m.ctx, nn::MoeOptions{kHidden, kExpert, kExperts, kTopK, true});
      h = h + (*f)(h);
      m.layers.push_back(std::move(f));
    } else {
      auto f = std::make_unique<DenseFfn>(m.ctx, kHidden, kExperts * kExpert);
      h = h + (*f)(h);
      m.layers.push_back(std::move(f));
    }
  }
  m.y = h;
  m.g = std::make_unique<Graph>(Graph::forward(m.y));
  for (auto& f : m.layers) f->allocate(cpu);
  for (auto& f : m.layers) f->init(7);
  m.buf = allocate_tensors(m.ctx, cpu);
  std::vector<float> xv(static_cast<size_t>(kHidden));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float((i * 37 % 101) - 50) / 50.0f;
  m.x.set(xv);
  const double es = sizeof(float);
  const double expert = 3.0 * kHidden * kExpert * es;
  m.bytes_per_token =
      layers * (moe ? kExperts * kHidden * es + kTopK * expert  // router + 2 experts
                    : kExperts * expert);
}

}  // namespace

int main(int argc, char** argv) {
  const int layers = argc > 1 ? std::max(1, std::atoi(argv[1])) : 4;
  const int steps = argc > 2 ? std::max(1, std::atoi(argv[2])) : 30;
  const int threads = argc > 3 ? std::max(1, std::atoi(argv[3])) : 2;
  double load = 0;
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf", &load) != 1) load = -1;
    std::fclose(f);
  }
  CpuBackend cpu(threads);
  Model moe, dense;
  build(moe, true, layers, cpu);
  build(dense, false, layers, cpu);
  std::printf(
      "load average %.2f; %d layers, hidden %lld, %lld experts x %lld (top %lld) vs dense "
      "%lld, f32 weights, %d threads, %d steps each\n",
      load, layers, (long long)kHidden, (long long)kExperts, (long long)kExpert, (long long)kTopK,
      (long long)(kExperts * kExpert), threads, steps);
  for (Model* m : {&moe, &dense}) cpu.compute(*m->g);  // warm-up
  // Sums and minimums: on a loaded machine the fastest step is the one least
  // disturbed by other processes, so the ratio of minimums is the steadier one.
  double t_moe = 0, t_dense = 0, min_moe = 1e30, min_dense = 1e30;
  using clock = std::chrono::steady_clock;
  for (int s = 0; s < steps; ++s)
    for (Model* m : {&moe, &dense}) {
      const auto t0 = clock::now();
      cpu.compute(*m->g);
      const double dt_s = std::chrono::duration<double>(clock::now() - t0).count();
      (m == &moe ? t_moe : t_dense) += dt_s;
      double& mn = m == &moe ? min_moe : min_dense;
      mn = std::min(mn, dt_s);
    }
  auto row = [&](const char* name, const Model& m, double t, double mn) {
    std::printf(
        "%-6s mean %8.3f ms/token (%6.1f tokens/s, %5.1f GB/s of weights), "
        "best %8.3f ms (%6.1f tokens/s, %5.1f GB/s)\n",
        name, 1e3 * t / steps, steps / t, m.bytes_per_token * steps / t / 1e9, 1e3 * mn, 1 / mn,
        m.bytes_per_token / mn / 1e9);
  };
  row("moe", moe, t_moe, min_moe);
  row("dense", dense, t_dense, min_dense);
  std::printf("tokens/s ratio moe / dense: %.2f (means), %.2f (best steps)\n", t_dense / t_moe,
              min_dense / min_moe);
  return 0;
}
