// x [B, T, D] -> Linear(w1, b1) -> GELU -> Linear(w2, b2), loss sum(y * t),
// backward included, then the CPU rewrites a test names (run by `rewrite` on
// the complete graph, as an OptContext runs them): the workload of the bf16
// rewrite tests (bias gradients summed from bf16, GELU's bf16 input).
#pragma once
#include <functional>
#include <memory>

#include "common/graph_checks.h"
#include "kiln/kiln.h"

namespace kiln_test {

struct GeluMlp {
  static constexpr int64_t B = 3, T = 100, M = B * T, D = 24, H = 40, O = 7;  // M > 256 rows
  kiln::Context ctx;
  kiln::Tensor x, w1, b1, w2, b2, t, a, loss;  // a: the first Linear's output
  kiln::Graph graph;
  std::unique_ptr<kiln::Buffer> buf;

  // `gelu_input` is what GELU reads of a (a itself, or a cast of it).
  GeluMlp(kiln::DType precision, kiln::GeluApprox approx,
          const std::function<kiln::Tensor(kiln::Tensor)>& gelu_input,
          const std::function<void(kiln::Graph&)>& rewrite) {
    using namespace kiln;
    ctx.set_matmul_precision(precision);
    x = ctx.param(f32, {B, T, D}, "x");
    w1 = ctx.param(f32, {H, D}, "w1");
    b1 = ctx.param(f32, {H}, "b1");
    w2 = ctx.param(f32, {O, H}, "w2");
    b2 = ctx.param(f32, {O}, "b2");
    t = ctx.input(f32, {M, O}, "t");
    a = (matmul(x.reshape({M, D}), w1.T()) + b1).reshape({B, T, H});
    Tensor y = matmul(gelu(gelu_input(a), approx).reshape({M, H}), w2.T()) + b2;
    loss = sum(y * t);
    graph = Graph::forward(loss);
    graph.backward(loss);
    rewrite(graph);
  }
  void run(int threads = 3) { buf = run_filled(ctx, graph, {x, w1, b1, w2, b2, t}, threads); }
  std::vector<float> grad(kiln::Tensor GeluMlp::*p) const {
    return graph.grad(this->*p).get<float>();
  }
};

}  // namespace kiln_test
