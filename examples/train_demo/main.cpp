// kiln-train-demo: a small, real training run with kiln's core API.
//
// A 2-layer MLP (tanh) learns to tell apart three interleaved spiral arms in the
// plane, a classic toy problem no linear model can solve. Each step uploads a
// minibatch into the graph's inputs, runs forward + backward on the CPU backend,
// reads the gradients and applies SGD with momentum on the host, then writes the
// parameters back. That host loop is what this demo shows; kiln/opt.h has the
// optimizers as graph ops (adamw_step, sgd_step) and the training loop
// (OptContext, fit) that examples/mnist uses.
//
// Exits 0 when the final training accuracy reaches the target, 1 when it does not,
// 2 on bad arguments or a kiln::Error: `--quick` is the ctest check.
#include <kiln/kiln.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace {

struct Options {
  int points_per_class = 200;
  int hidden = 64;
  int batch = 60;
  int steps = 3000;
  int log_every = 250;
  float lr = 0.1f;
  float momentum = 0.9f;
  float target = 0.95f;  // final training accuracy that counts as success
  int threads = 0;       // 0: one per hardware thread
  unsigned seed = 42;
};

constexpr int kClasses = 3;

// Fills o from the command line; returns the exit status when the program should
// stop here (--help: 0, a bad argument: 2).
std::optional<int> parse(int argc, char** argv, Options& o) {
  CLI::App app{"kiln-train-demo: a 2-layer MLP learns three spiral arms (kiln's graph API)"};
  bool quick = false;
  app.add_flag("--quick", quick, "fewer steps (the ctest check); still must reach the target");
  app.add_option("--steps", o.steps, "SGD steps")
      ->check(CLI::Range(1, 100000000))
      ->capture_default_str();
  app.add_option("--threads", o.threads, "CPU backend threads (0: one per hardware thread)")
      ->check(CLI::Range(0, 4096))
      ->capture_default_str();
  app.add_option("--seed", o.seed, "data and initialisation seed")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  if (quick) {
    if (app.count("--steps") == 0) o.steps = 1500;
    o.log_every = 500;
  }
  o.log_every = std::min(o.log_every, o.steps);
  return std::nullopt;
}

// Three spiral arms: arm c starts at angle 2*pi*c/3 and winds 1.25 turns while
// its radius grows from 0 to 1; the angle gets a little noise.
struct Dataset {
  std::vector<float> x;  // [n, 2]
  std::vector<int32_t> y;
  int n = 0;
};

Dataset make_spirals(int per_class, std::mt19937& rng) {
  Dataset d;
  d.n = per_class * kClasses;
  std::normal_distribution<float> noise(0.0f, 0.12f);
  const float pi = 3.14159265358979f;
  for (int c = 0; c < kClasses; ++c) {
    for (int i = 0; i < per_class; ++i) {
      float t = float(i) / float(per_class - 1);
      float angle = 2 * pi * c / kClasses + 2.5f * pi * t + noise(rng) * t;
      d.x.push_back(t * std::cos(angle));
      d.x.push_back(t * std::sin(angle));
      d.y.push_back(c);
    }
  }
  return d;
}

// The model's parameters and their host copies (the "optimizer state" lives here).
struct Param {
  explicit Param(kiln::Tensor tensor) : t(tensor) {}
  kiln::Tensor t;
  std::vector<float> value, velocity;
};

void init_normal(Param& p, float stddev, std::mt19937& rng) {
  std::normal_distribution<float> dist(0.0f, stddev);
  p.value.resize(size_t(p.t.numel()));
  for (float& v : p.value) v = dist(rng);
  p.velocity.assign(p.value.size(), 0.0f);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (const std::optional<int> rc = parse(argc, argv, opt)) return *rc;
  try {
    std::mt19937 rng(opt.seed);
    const Dataset data = make_spirals(opt.points_per_class, rng);
    const int B = opt.batch, H = opt.hidden;

    // ---- the model, built once: graphs are static, only data changes per step
    kiln::Context ctx;
    Param w1(ctx.param(kiln::f32, {2, H}, "w1")), b1(ctx.param(kiln::f32, {H}, "b1"));
    Param w2(ctx.param(kiln::f32, {H, kClasses}, "w2"));
    Param b2(ctx.param(kiln::f32, {kClasses}, "b2"));
    Param* params[] = {&w1, &b1, &w2, &b2};
    auto mlp = [&](kiln::Tensor x) {
      return kiln::matmul(kiln::tanh(kiln::matmul(x, w1.t) + b1.t), w2.t) + b2.t;
    };

    // Training graph: one minibatch, forward + backward.
    kiln::Tensor xb = ctx.input(kiln::f32, {B, 2}, "x");
    kiln::Tensor yb = ctx.input(kiln::i32, {B}, "labels");
    kiln::Tensor loss = kiln::cross_entropy(mlp(xb), yb);
    kiln::Graph train = kiln::Graph::forward(loss);
    train.backward(loss);

    // Evaluation graph: the whole data set, forward only, same parameters.
    kiln::Tensor xa = ctx.input(kiln::f32, {data.n, 2}, "x_all");
    kiln::Tensor ya = ctx.input(kiln::i32, {data.n}, "labels_all");
    kiln::Tensor correct = kiln::count_equal(kiln::argmax(mlp(xa), 1), ya);
    kiln::Graph eval = kiln::Graph::forward(correct);

    kiln::CpuBackend backend(opt.threads);
    auto buffer = kiln::allocate_tensors(ctx, backend);
    xa.set(data.x);
    ya.set(data.y);

    // Normal initialisation. The first layer's weights are large (std 3) so the
    // tanh units start as steep, varied boundaries across the unit disc: the
    // tightly wound arms need them.
    init_normal(w1, 3.0f, rng);
    init_normal(b1, 1.0f, rng);
    init_normal(w2, 1.0f / std::sqrt(float(H)), rng);
    b2.value.assign(size_t(b2.t.numel()), 0.0f);
    b2.velocity = b2.value;
    for (Param* p : params) p->t.set(p->value);

    std::printf(
        "kiln-train-demo: %d-point 3-arm spiral, MLP 2-%d-3 (tanh), batch %d, "
        "%d steps, %d threads\n",
        data.n, H, B, opt.steps, backend.n_threads());
    std::printf("train graph: %zu nodes (forward %zu), eval graph: %zu nodes\n", train.size(),
                train.n_forward(), eval.size());

    std::vector<int> order(size_t(data.n));
    std::iota(order.begin(), order.end(), 0);
    std::vector<float> bx(static_cast<size_t>(B) * 2);
    std::vector<int32_t> by(static_cast<size_t>(B));
    size_t cursor = order.size();  // reshuffle on first use
    double loss_sum = 0;
    int loss_count = 0;

    auto t0 = std::chrono::steady_clock::now();
    for (int step = 1; step <= opt.steps; ++step) {
      // Next minibatch of a fresh permutation each epoch.
      for (int k = 0; k < B; ++k) {
        if (cursor == order.size()) {
          std::shuffle(order.begin(), order.end(), rng);
          cursor = 0;
        }
        int i = order[cursor++];
        bx[2 * k] = data.x[2 * size_t(i)];
        bx[2 * k + 1] = data.x[2 * size_t(i) + 1];
        by[k] = data.y[size_t(i)];
      }
      xb.set(bx);
      yb.set(by);

      backend.compute(train);
      float l = loss.item();
      if (!std::isfinite(l)) {
        std::fprintf(stderr, "kiln-train-demo: loss became %g at step %d\n", l, step);
        return 1;
      }
      loss_sum += l;
      ++loss_count;

      // SGD with momentum on the host.
      for (Param* p : params) {
        std::vector<float> g = train.grad(p->t).get<float>();
        for (size_t j = 0; j < g.size(); ++j) {
          p->velocity[j] = opt.momentum * p->velocity[j] + g[j];
          p->value[j] -= opt.lr * p->velocity[j];
        }
        p->t.set(p->value);
      }
      train.reset_grads();

      if (step % opt.log_every == 0 || step == opt.steps) {
        backend.compute(eval);
        std::printf("step %5d  loss %.4f  train accuracy %5.1f%%\n", step, loss_sum / loss_count,
                    100.0 * correct.item() / data.n);
        loss_sum = 0;
        loss_count = 0;
      }
    }
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

    backend.compute(eval);
    double acc = correct.item() / data.n;
    std::printf("final train accuracy %.1f%% (target %.0f%%) in %.2f s, %.0f us/step\n", 100 * acc,
                100 * opt.target, secs, 1e6 * secs / opt.steps);
    if (acc < opt.target) {
      std::fprintf(stderr, "kiln-train-demo: FAILED to reach the target accuracy\n");
      return 1;
    }
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln-train-demo: %s\n", e.what());
    return 2;
  }
}
