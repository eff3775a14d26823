// Builds and runs a two-op graph, relu(a + b) with b broadcast over the rows of a,
// on the CPU backend of an installed kiln.
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <vector>

int main() {
  try {
    kiln::Context ctx;
    kiln::Tensor a = ctx.input(kiln::f32, {2, 3}, "a");
    kiln::Tensor b = ctx.input(kiln::f32, {3}, "b");
    kiln::Tensor y = kiln::relu(a + b);
    kiln::Graph g = kiln::Graph::forward(y);

    kiln::CpuBackend backend(1);
    auto buffer = kiln::allocate_tensors(ctx, backend);
    a.set<float>({1, -2, 3, -4, 5, -6});
    b.set<float>({0.5f, 1, -1});
    backend.compute(g);

    const std::vector<float> want = {1.5f, 0, 2, 0, 6, 0};
    const std::vector<float> got = y.get<float>();
    if (got.size() != want.size()) {
      std::fprintf(stderr, "consumer: got %zu values, want %zu\n", got.size(), want.size());
      return 1;
    }
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::fabs(got[i] - want[i]) > 1e-6f) {
        std::fprintf(stderr, "consumer: y[%zu] = %g, want %g\n", i, got[i], want[i]);
        return 1;
      }
    }
    std::printf("consumer: relu(a + b) on %s is correct (%zu nodes)\n", backend.name(), g.size());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "consumer: kiln::Error: %s\n", e.what());
    return 1;
  }
}
