// GELU and its fused gradients reading a bf16 x (Graph::bf16_gelu_inputs),
// with an f32 or a bf16 result (a cast fused in): the CPU kernels give what
// the f32 op gives on the widened values (and a bf16 result is that value
// rounded as a COPY rounds it), for 1 and 3 threads, bit for bit on dense and
// transposed runs alike: every layout and dtype runs the same vector code
// (unary.cpp, kChunk), so this holds on every ISA. It once failed on AVX-512
// only, when the f32 op computed strided runs in scalar code: near the zero of
// GELU's derivative (x = -0.75) a last-bit difference between the scalar and
// vector forms became tens of ulps of the result.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "common/random_values.h"
#include "kiln/ext/op_builder.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/kiln.h"

namespace kiln::test {
namespace {

struct Pair {
  std::vector<uint16_t> got16, want16;  // bf16 results (when d16)
  std::vector<float> got, want;         // f32 results
};

// op on x read as bf16 (got) and as the f32 widening of the same values
// (want), x [shape] or its transpose; a backward op also reads dy (f32).
Pair run(Op op, const Shape& shape, bool transposed, bool d16, int threads) {
  Context ctx;
  const bool back = op == Op::GELU_BACK || op == Op::GELU_ERF_BACK;
  Tensor x16 = ctx.input(bf16, shape, "x16"), x32 = ctx.input(f32, shape, "x32");
  Tensor dy = ctx.input(f32, transposed ? Shape{shape[1], shape[0]} : shape, "dy");
  Tensor a16 = transposed ? x16.T() : x16, a32 = transposed ? x32.T() : x32;
  auto node = [&](Tensor x, DType out) {
    return Tensor(back ? detail::new_op(op, out, x.shape(), {dy.node(), x.node()})
                       : detail::new_op(op, out, x.shape(), {x.node()}));
  };
  Tensor got = node(a16, d16 ? bf16 : f32);
  Tensor want32 = node(a32, f32);
  Tensor want = d16 ? want32.to(bf16) : want32;
  Graph g = Graph::forward({want, got});
  CpuBackend cpu(threads);
  auto buf = allocate_tensors(ctx, cpu);
  const kiln_test::Bf16Values v = kiln_test::bf16_values(size_t(shape.numel()), 3, 4.0f);
  x16.set(v.bits);
  x32.set(v.widened);
  dy.set(kiln_test::uniform_floats(size_t(shape.numel()), 4));
  cpu.compute(g);
  Pair p;
  if (d16) p.got16 = got.get<uint16_t>(), p.want16 = want.get<uint16_t>();
  else p.got = got.get<float>(), p.want = want.get<float>();
  return p;
}

// Distance in units in the last place (same-sign floats).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(int64_t(ia) - int64_t(ib));
}

TEST(GeluBf16X, MatchesTheF32OpOnTheWidenedValues) {
  const Shape shapes[] = {{300, 40}, {7, 5}, {3, 1000}};  // chunks, a short run, a long row
  for (Op op : {Op::GELU, Op::GELU_ERF, Op::GELU_BACK, Op::GELU_ERF_BACK})
    for (const Shape& s : shapes)
      for (bool transposed : {false, true})
        for (bool d16 : {false, true})
          for (int threads : {1, 3}) {
            const Pair p = run(op, s, transposed, d16, threads);
            SCOPED_TRACE(std::string(op_name(op)) + " " + s.str() + (transposed ? " T" : "") +
                         (d16 ? " bf16 out" : "") + " threads " + std::to_string(threads));
            if (d16) {
              ASSERT_EQ(p.got16.size(), size_t(s.numel()));
              for (size_t i = 0; i < p.got16.size(); ++i) EXPECT_EQ(p.got16[i], p.want16[i]) << i;
            } else {
              ASSERT_EQ(p.got.size(), size_t(s.numel()));
              for (size_t i = 0; i < p.got.size(); ++i)
                EXPECT_EQ(ulps(p.got[i], p.want[i]), 0) << i;
            }
          }
}

// The f32 ops on a transposed view give what they give on a contiguous copy,
// bit for bit: the property the test above rests on, checked on the f32 path
// alone (values around GELU's derivative zero at x = -0.75 included).
TEST(GeluBf16X, ViewsComputeWhatContiguousCopiesCompute) {
  for (Op op : {Op::GELU, Op::GELU_ERF, Op::GELU_BACK, Op::GELU_ERF_BACK})
    for (int threads : {1, 3}) {
      SCOPED_TRACE(std::string(op_name(op)) + " threads " + std::to_string(threads));
      const Shape s{300, 40};
      const bool back = op == Op::GELU_BACK || op == Op::GELU_ERF_BACK;
      Context ctx;
      Tensor x = ctx.input(f32, s, "x");
      Tensor dy = ctx.input(f32, Shape{s[1], s[0]}, "dy");
      Tensor xt = x.T(), xc = x.T().contiguous();
      auto node = [&](Tensor a) {
        return Tensor(back ? detail::new_op(op, f32, a.shape(), {dy.node(), a.node()})
                           : detail::new_op(op, f32, a.shape(), {a.node()}));
      };
      Tensor on_view = node(xt), on_copy = node(xc);
      Graph g = Graph::forward({on_view, on_copy});
      CpuBackend cpu(threads);
      auto buf = allocate_tensors(ctx, cpu);
      std::vector<float> xv = kiln_test::bf16_values(size_t(s.numel()), 5, 4.0f).widened;
      for (size_t i = 0; i < xv.size(); i += 7) xv[i] = -0.75f + 1e-3f * float(i % 13);
      x.set(xv);
      dy.set(kiln_test::uniform_floats(size_t(s.numel()), 6));
      cpu.compute(g);
      const std::vector<float> a = on_view.get<float>(), b = on_copy.get<float>();
      ASSERT_EQ(a.size(), b.size());
      EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
    }
}

}  // namespace
}  // namespace kiln::test
