// embedding() of a q8_0 / q4_0 table: the rows it gathers are the table's
// blocks dequantized (equal to gathering from w.to(f32)), on one thread and on
// several (one index splits its row at block bounds); a transposed table and a
// gradient into a quantized table are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/error_check.h"
#include "kiln/ext/alloc.h"
#include "kiln/kiln.h"

namespace {

using kiln::DType;
using kiln::f32;
using kiln::i32;
using kiln::Tensor;

class QuantEmbedding : public ::testing::TestWithParam<DType> {};

TEST_P(QuantEmbedding, RowsEqualTheDequantizedTablesRows) {
  const DType q = GetParam();
  const int64_t V = 7, D = 544;  // 17 blocks per row
  std::vector<float> w(size_t(V * D));
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * float(i)) * float(1 + i % 5);
  const std::vector<int32_t> many = {3, 0, 6, 3, 5, 1, 1, 2};
  for (int threads : {1, 2, 3}) {
    kiln::Context ctx;
    Tensor table = ctx.param(q, {V, D}, "table");
    table.set_requires_grad(false);
    Tensor idx = ctx.input(i32, {2, 4}, "idx"), one = ctx.input(i32, {1}, "one");
    Tensor got = kiln::embedding(table, idx), got1 = kiln::embedding(table, one);
    Tensor deq = table.to(f32);
    Tensor want = kiln::embedding(deq, idx), want1 = kiln::embedding(deq, one);
    EXPECT_EQ(got.dtype(), f32);
    EXPECT_EQ(got.shape(), kiln::Shape({2, 4, D}));
    kiln::Graph g = kiln::Graph::forward({got, got1, want, want1});
    kiln::CpuBackend cpu(threads);
    auto buf = kiln::allocate_tensors(ctx, cpu);
    table.set(w);
    idx.set(many);
    one.set(std::vector<int32_t>{4});
    cpu.compute(g);
    EXPECT_EQ(got.get<float>(), want.get<float>()) << threads << " threads";
    EXPECT_EQ(got1.get<float>(), want1.get<float>()) << threads << " threads";
    // Quantized, not copied: a row differs from the f32 values it was made from.
    const std::vector<float> row = got1.get<float>();
    EXPECT_NE(row, std::vector<float>(w.begin() + 4 * D, w.begin() + 5 * D));
    for (int64_t c = 0; c < D; ++c) EXPECT_NEAR(row[size_t(c)], w[size_t(4 * D + c)], 0.8f) << c;
  }
}

TEST_P(QuantEmbedding, OutOfRangeIndexIsReported) {
  kiln::Context ctx;
  Tensor table = ctx.param(GetParam(), {4, 64}, "table");
  table.set_requires_grad(false);
  Tensor idx = ctx.input(i32, {3}, "idx");
  Tensor y = kiln::embedding(table, idx);
  kiln::Graph g = kiln::Graph::forward({y});
  kiln::CpuBackend cpu(2);
  auto buf = kiln::allocate_tensors(ctx, cpu);
  idx.set(std::vector<int32_t>{0, 4, 1});
  EXPECT_KILN_ERROR(cpu.compute(g), "embedding", "index 4 at position 1", "4 rows");
}

TEST_P(QuantEmbedding, TransposedTablesAndGradientsAreRefused) {
  const DType q = GetParam();
  kiln::Context ctx;
  Tensor table = ctx.param(q, {64, 64}, "table");
  Tensor idx = ctx.input(i32, {3}, "idx");
  EXPECT_KILN_ERROR((void)kiln::embedding(table.T(), idx), "embedding", "[64, 64]",
                    kiln::dtype_name(q), "transposed");
  // A trainable f32 table quantized in the graph: the gradient would flow into
  // the quantized table, which embedding refuses, naming it.
  Tensor p = ctx.param(f32, {8, 64}, "p");
  Tensor loss = kiln::sum(kiln::embedding(p.to(q), idx));
  kiln::Graph g = kiln::Graph::forward({loss});
  EXPECT_KILN_ERROR(g.backward(loss), "embedding", kiln::dtype_name(q), "no gradient", "frozen");
  // A quantized param that is not frozen is refused before any rule runs.
  Tensor l2 = kiln::sum(kiln::embedding(table, idx));
  kiln::Graph g2 = kiln::Graph::forward({l2});
  EXPECT_KILN_ERROR(g2.backward(l2), "backward", "'table'", "freeze");
}

INSTANTIATE_TEST_SUITE_P(Dtypes, QuantEmbedding, ::testing::Values(kiln::q8_0, kiln::q4_0),
                         [](const auto& info) {
                           return std::string(kiln::dtype_name(info.param));
                         });

}  // namespace
