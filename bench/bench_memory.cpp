// Memory planning figures (sizes, not time): for forward+backward graphs of an
// MLP, the MNIST CNN and a small transformer block, the graph allocator's planned
// buffer against the sum of all tensor sizes (no reuse) and the lower bound (the
// largest sum of tensors live at one step of the same execution order).
//
//   build/<dir>/bench/bench_memory            # a markdown table on stdout
//
// Two rows per model: "all" plans every tensor (inputs, params, gradient
// accumulators included) in one buffer; "activations" leaves params and
// accumulators to a separate weight buffer (as training does) and plans the rest.
// The plan is pure metadata: no memory is allocated and no kernel runs.
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>

#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

using namespace kiln;

namespace {

Tensor linear(Context& ctx, Tensor x, int64_t in, int64_t out, const std::string& name) {
  Tensor w = ctx.param(f32, {in, out}, name + ".w"), b = ctx.param(f32, {out}, name + ".b");
  return matmul(x, w) + b;
}

// (a) 784 -> 500 ReLU -> 10, cross-entropy, batch 500.
Tensor mlp(Context& ctx) {
  const int64_t n = 500;
  Tensor x = ctx.input(f32, {n, 784}, "x"), y = ctx.input(i32, {n}, "y");
  Tensor h = relu(linear(ctx, x, 784, 500, "fc1"));
  return cross_entropy(linear(ctx, h, 500, 10, "fc2"), y);
}

// (b) conv 3x3 1->8 pad 1, ReLU, max-pool 2; conv 3x3 8->16 pad 1, ReLU, max-pool 2;
// dense 784 -> 10; batch 500.
Tensor cnn(Context& ctx) {
  const int64_t n = 500;
  Tensor x = ctx.input(f32, {n, 1, 28, 28}, "x"), y = ctx.input(i32, {n}, "y");
  Conv2dOptions same;
  same.padding[0] = same.padding[1] = 1;
  Tensor h = conv2d(x, ctx.param(f32, {8, 1, 3, 3}, "c1.w"), ctx.param(f32, {8}, "c1.b"), same);
  h = max_pool2d(relu(h));
  h = conv2d(h, ctx.param(f32, {16, 8, 3, 3}, "c2.w"), ctx.param(f32, {16}, "c2.b"), same);
  h = max_pool2d(relu(h));
  return cross_entropy(linear(ctx, h.reshape({n, 784}), 784, 10, "fc"), y);
}

// (c) pre-norm transformer block: batch 8, seq 64, d 128, 4 heads (reshape/permute),
// causal softmax, MLP 4x with GELU; MSE against a target.
Tensor transformer(Context& ctx) {
  const int64_t b = 8, t = 64, d = 128, nh = 4, hd = d / nh;
  Tensor x = ctx.input(f32, {b, t, d}, "x"), target = ctx.input(f32, {b, t, d}, "target");
  auto norm = [&](Tensor v, const std::string& name) {
    return layer_norm(v, ctx.param(f32, {d}, name + ".w"), ctx.param(f32, {d}, name + ".b"));
  };
  Tensor h = norm(x, "ln1");
  auto heads = [&](Tensor v) {
    return v.reshape({b, t, nh, hd}).permute({0, 2, 1, 3});
  };  // [b, nh, t, hd]
  Tensor q = heads(linear(ctx, h, d, d, "q")), k = heads(linear(ctx, h, d, d, "k"));
  Tensor v = heads(linear(ctx, h, d, d, "v"));
  SoftmaxOptions causal;
  causal.causal = true;
  causal.scale = 1.0f / std::sqrt(float(hd));
  Tensor att = softmax(matmul(q, k.transpose(-2, -1)), causal);        // [b, nh, t, t]
  Tensor o = matmul(att, v).permute({0, 2, 1, 3}).reshape({b, t, d});  // copy, then view
  Tensor x1 = x + linear(ctx, o, d, d, "proj");
  Tensor m = linear(ctx, gelu(linear(ctx, norm(x1, "ln2"), d, 4 * d, "up")), 4 * d, d, "down");
  return mse_loss(x1 + m, target);
}

std::string mib(size_t bytes) {
  char s[32];
  std::snprintf(s, sizeof s, "%.2f", double(bytes) / (1024.0 * 1024.0));
  return s;
}

void row(const char* model, const char* what, const Graph& g, const MemoryPlan& p) {
  std::printf("| %-11s | %-11s | %5zu | %9s | %8s | %8s | %6.3f | %8s (%.3f) | %-9s | %8zu |\n",
              model, what, g.nodes().size(), mib(p.total_size).c_str(), mib(p.buffer_size).c_str(),
              mib(p.lower_bound).c_str(), double(p.buffer_size) / double(p.lower_bound),
              mib(p.best_fit_size).c_str(), double(p.best_fit_size) / double(p.lower_bound),
              p.strategy, p.n_inplace);
}

}  // namespace

int main() {
  std::printf(
      "| model       | scope       | nodes | no reuse  | planned  | lower bd | ratio  | best-fit "
      "only    | placement | in-place |\n");
  std::printf(
      "|-------------|-------------|------:|----------:|---------:|---------:|-------:|------------"
      "-----:|-----------|---------:|\n");
  const std::pair<const char*, std::function<Tensor(Context&)>> models[] = {
      {"MLP", mlp}, {"CNN", cnn}, {"transformer", transformer}};
  std::string no_inplace;
  for (const auto& [name, build] : models) {
    Context ctx;
    Tensor loss = build(ctx);
    Graph g = Graph::forward(loss);
    g.backward(loss);
    GraphAllocator galloc(host_buffer_type());
    row(name, "all", g, galloc.measure(g));
    NodeList acts(g);
    acts.mine = [](const TensorNode* t) { return !(t->flags & (kFlagParam | kFlagGradAcc)); };
    row(name, "activations", g, galloc.measure(acts));
    // The same without in-place reuse: what in-place saves.
    GraphAllocator plain(host_buffer_type(), {.inplace = false});
    const MemoryPlan p = plain.measure(acts);
    char line[200];
    std::snprintf(line, sizeof line, "| %-11s | %8s | %8s | %6.3f |\n", name,
                  mib(p.buffer_size).c_str(), mib(p.lower_bound).c_str(),
                  double(p.buffer_size) / double(p.lower_bound));
    no_inplace += line;
  }
  std::printf(
      "\nSizes in MiB (2^20 bytes), 64-byte aligned blocks (host buffer type). ratio = planned / "
      "lower bound.\n");
  std::printf("\nActivations without in-place reuse:\n\n");
  std::printf(
      "| model       | planned  | lower bd | ratio  "
      "|\n|-------------|---------:|---------:|-------:|\n%s",
      no_inplace.c_str());
  return 0;
}
