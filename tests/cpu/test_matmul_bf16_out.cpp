// MATMUL with a bf16 dst (a cast folded into the product by
// Graph::fuse_bf16_casts) against the f32 MATMUL of the same operands rounded
// by kiln::f32_to_bf16 (what the COPY it replaces does): the same bits on every
// path run_matmul takes (the one-row x @ W^T dot products of gemv.h, gemm's
// few-rows, few-columns and blocked paths, batches), with and without a bias,
// for 1 and 3 threads. The paths sum in different orders, so the bf16 dst must
// take the same path as the f32 product whatever the shape.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "cpu/kernel_test_util.h"

namespace kiln::kernel_test {
namespace {

struct Case {
  Shape a, b, out;
  bool b_trans;  // b a transposed view (W.T(): rs = 1), as a Linear's weight
  bool bias;
};

std::string describe(const Case& c, int nth) {
  return c.a.str() + " @ " + c.b.str() + (c.b_trans ? " (b transposed)" : "") +
         (c.bias ? " + bias" : "") + " nth=" + std::to_string(nth);
}

// Operands whose products nearly cancel: the second half of each row of a
// repeats its first half, and the second half of each column of b is minus its
// first plus noise of 2^-16. The partial sums (~4096 sqrt(K)) end near 1, so
// each order of sums leaves its own rounding error in the bf16 result; with
// plain random operands the paths differ only in f32's last bits, which seldom
// move a bf16 rounding.
void fill_cancelling(TensorNode* a, TensorNode* b) {
  const int64_t K = a->shape[a->shape.ndim() - 1], N = b->shape[b->shape.ndim() - 1], h = K / 2;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> av(size_t(a->numel())), bv(size_t(b->numel()));
  for (int64_t i = 0; i < a->numel(); ++i)
    av[size_t(i)] = i % K < h ? 4096 * u(rng) : av[size_t(i - h)];
  for (int64_t i = 0; i < b->numel(); ++i)
    bv[size_t(i)] = i / N % K < h ? u(rng) : -bv[size_t(i - h * N)] + 0x1p-16f * u(rng);
  for (int64_t i = 0; i < a->numel(); ++i) set(a, i, av[size_t(i)]);
  for (int64_t i = 0; i < b->numel(); ++i) set(b, i, bv[size_t(i)]);
}

void check(const Case& c) {
  Nodes ns;
  TensorNode* a = ns.make(f32, c.a);
  TensorNode* b = c.b_trans ? ns.transposed(f32, c.b) : ns.make(f32, c.b);
  TensorNode* bias = ns.make(f32, {c.out[c.out.ndim() - 1]});
  fill_cancelling(a, b);
  fill_random(bias, -1, 1, 3);
  for (int nth : {1, 3}) {
    auto product = [&](DType t) {
      return c.bias ? ns.op(Op::MATMUL, t, c.out, {a, b, bias})
                    : ns.op(Op::MATMUL, t, c.out, {a, b});
    };
    TensorNode* y32 = product(f32);
    TensorNode* y16 = product(bf16);
    run(cpu::kernel_MATMUL, y32, nth);
    run(cpu::kernel_MATMUL, y16, nth);
    const uint16_t* got = static_cast<const uint16_t*>(y16->data);
    int bad = 0;
    for (int64_t i = 0; i < y32->numel() && bad < 5; ++i) {
      const uint16_t want = f32_to_bf16(at(y32, i));
      if (got[i] != want) {
        ++bad;
        ADD_FAILURE() << describe(c, nth) << " element " << i << ": " << got[i] << " != " << want
                      << " (f32 " << at(y32, i) << ")";
      }
    }
  }
}

TEST(MatmulBf16Out, EqualsTheRoundedF32ProductOnEveryPath) {
  const Case cases[] = {
      {{1, 300}, {300, 70}, {1, 70}, true, false},           // one row x W^T: dot products
      {{1, 300}, {300, 70}, {1, 70}, true, true},            //   with a bias
      {{2, 1, 96}, {96, 40}, {2, 1, 40}, true, false},       //   per batch
      {{1, 300}, {300, 70}, {1, 70}, false, true},           // one row, W row-major: few rows
      {{3, 50}, {50, 130}, {3, 130}, false, true},           // few rows
      {{40, 600}, {600, 3}, {40, 3}, true, true},            // few columns
      {{37, 300}, {300, 70}, {37, 70}, true, true},          // blocked
      {{2, 17, 40}, {2, 40, 33}, {2, 17, 33}, true, false},  // batches, blocked
  };
  for (const Case& c : cases) check(c);
}

}  // namespace
}  // namespace kiln::kernel_test
