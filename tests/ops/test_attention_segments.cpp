// attention() with segment ids (packed examples) against the composite it
// fuses: softmax(scale q k^T + mask) v with an additive mask, -inf where the
// query and the key lie in different runs of equal ids, built from the ids on
// the host. Outputs and the gradients of q, k and v agree, on the small-head
// kernels (T <= 64) and the tiled ones, causal and not; and the builder's
// errors name what is wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "common/error_check.h"
#include "common/random_values.h"
#include "kiln/kiln.h"

namespace kiln {
namespace {

// Ids of runs of the given lengths (the last stretched to T), ids 0, 1, 2, 0, ...
std::vector<int32_t> run_ids(int64_t rows, int64_t T, const std::vector<int64_t>& runs) {
  std::vector<int32_t> ids(size_t(rows * T));
  for (int64_t r = 0; r < rows; ++r) {
    int64_t t = 0;
    for (size_t k = 0; t < T; ++k) {
      const int64_t n = k < runs.size() ? runs[k] + r : T;  // rows differ
      for (int64_t i = 0; i < n && t < T; ++i, ++t) ids[size_t(r * T + t)] = int32_t(k % 3);
    }
  }
  return ids;
}

// 0 where query i and key j lie in one run, -inf elsewhere: [rows, 1, T, T].
std::vector<float> run_mask(const std::vector<int32_t>& ids, int64_t rows, int64_t T) {
  std::vector<float> m(size_t(rows * T * T), 0.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < T; ++j) {
        bool same = true;
        for (int64_t t = std::min(i, j); t < std::max(i, j); ++t)
          same = same && ids[size_t(r * T + t)] == ids[size_t(r * T + t + 1)];
        if (!same) m[size_t((r * T + i) * T + j)] = -std::numeric_limits<float>::infinity();
      }
  return m;
}

void check_against_composite(int64_t B, int64_t H, int64_t T, int64_t E, bool causal,
                             const std::vector<int64_t>& runs) {
  SCOPED_TRACE("T " + std::to_string(T) + (causal ? " causal" : " full"));
  Context ctx;
  const Shape s{B, H, T, E};
  Tensor q = ctx.param(f32, s, "q"), k = ctx.param(f32, s, "k"), v = ctx.param(f32, s, "v");
  Tensor w = ctx.input(f32, s, "w");  // the loss's weights: sum(out * w)
  Tensor seg = ctx.input(i32, {B, T}, "segments");
  Tensor mask = ctx.input(f32, {B, 1, T, T}, "mask");
  const float scale = 1.0f / std::sqrt(float(E));
  Tensor fused = attention(q, k, v, {scale, causal, seg});
  SoftmaxOptions so;
  so.scale = scale;
  so.mask = mask;
  so.causal = causal;
  Tensor composite = matmul(softmax(matmul(q, k.T()), so), v);
  // Gradients through sum(out * w), one graph each.
  Tensor lf = sum(fused * w), lc = sum(composite * w);
  Graph gf = Graph::forward(lf), gc = Graph::forward(lc);
  gf.backward(lf);
  gc.backward(lc);
  CpuBackend cpu(2);
  auto buf = allocate_tensors(ctx, cpu);
  std::mt19937 rng(uint32_t(T + E));
  for (Tensor t : {q, k, v, w}) t.set(kiln_test::uniform_floats(size_t(s.numel()), rng, 1.5f));
  const std::vector<int32_t> ids = run_ids(B, T, runs);
  seg.set(ids);
  mask.set(run_mask(ids, B, T));
  gf.reset_grads();
  gc.reset_grads();
  cpu.compute(gf);
  const std::vector<float> out_f = fused.get<float>();
  std::vector<std::vector<float>> grad_f;
  for (Tensor p : {q, k, v}) grad_f.push_back(gf.grad(p).get<float>());
  cpu.compute(gc);
  EXPECT_LT(kiln_test::max_abs_diff(out_f, composite.get<float>()), 2e-5);
  const char* names[] = {"dq", "dk", "dv"};
  int i = 0;
  for (Tensor p : {q, k, v}) {
    EXPECT_LT(kiln_test::max_abs_diff(grad_f[size_t(i)], gc.grad(p).get<float>()), 5e-5)
        << names[i];
    ++i;
  }
}

TEST(AttentionSegments, MatchTheMaskedSoftmaxComposite) {
  for (const bool causal : {true, false}) {
    check_against_composite(2, 3, 37, 16, causal, {5, 1, 12});    // small-head kernels
    check_against_composite(2, 2, 150, 24, causal, {3, 70, 40});  // tiled kernels
  }
}

TEST(AttentionSegments, BuilderErrorsNameTheProblem) {
  Context ctx;
  Tensor q = ctx.input(f32, {2, 4, 8, 16}), k = ctx.input(f32, {2, 4, 8, 16});
  Tensor kv = ctx.input(f32, {2, 4, 9, 16});
  EXPECT_KILN_ERROR(attention(q, k, k, {0.0f, true, ctx.input(f32, {2, 8})}), "attention",
                    "segments", "i32 [S, T]", "f32");
  EXPECT_KILN_ERROR(attention(q, k, k, {0.0f, true, ctx.input(i32, {3, 8})}), "attention",
                    "S dividing the 8 heads", "[3, 8]");
  EXPECT_KILN_ERROR(attention(q, kv, kv, {0.0f, true, ctx.input(i32, {2, 8})}), "attention",
                    "as many queries as keys");
}

}  // namespace
}  // namespace kiln
