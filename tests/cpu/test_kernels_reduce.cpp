// Direct checks of the reduction and matmul kernels: values against double
// loops, and bit-identical results for 1, 2 and 3 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "kernel_test_util.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::kernel_test {
namespace {

const float kReduceNaN = std::numeric_limits<float>::quiet_NaN();

ReduceParams axis_params(int64_t axis, bool keepdim) { return {axis, keepdim}; }

TEST(KernelsReduce, FullSumIsBitIdenticalForAnyThreadCount) {
  for (bool strided : {false, true}) {
    Nodes ns;
    TensorNode* x = strided ? ns.transposed(f32, {1031, 1017}) : ns.make(f32, {1000037});
    fill_random(x, -1, 2, 21);
    double ref = 0;
    for (int64_t i = 0; i < x->numel(); ++i) ref += at(x, i);
    float first = 0;
    for (int nth : {1, 2, 3}) {
      TensorNode* d = ns.op(Op::SUM, f32, {}, {x}, axis_params(-1, false));
      run(cpu::kernel_SUM, d, nth);
      float v = at(d, 0);
      if (nth == 1) first = v;
      EXPECT_TRUE(same_bits(v, first)) << "nth=" << nth << " " << v << " vs " << first;
      EXPECT_NEAR(v, ref, 1e-6 * std::fabs(ref)) << "strided=" << strided;
    }
  }
}

TEST(KernelsReduce, AxisSumAndMaxMatchReference) {
  for (bool strided : {false, true}) {
    for (int axis = 0; axis < 3; ++axis) {
      for (bool keep : {false, true}) {
        Nodes ns;
        Shape s{37, 300, 21};
        TensorNode* x = strided ? ns.transposed(f32, s) : ns.make(f32, s);
        fill_random(x, -1, 1, 22 + axis);
        Shape o;
        for (int d = 0; d < 3; ++d) {
          if (d != axis) o.push_back(s[d]);
          else if (keep) o.push_back(1);
        }
        for (bool is_max : {false, true}) {
          Op op = is_max ? Op::MAX : Op::SUM;
          Kernel k = is_max ? cpu::kernel_MAX : cpu::kernel_SUM;
          TensorNode* d1 = ns.op(op, f32, o, {x}, axis_params(axis, keep));
          TensorNode* d2 = ns.op(op, f32, o, {x}, axis_params(axis, keep));
          run(k, d1, 1);
          run(k, d2, 3);
          for (int64_t i = 0; i < d1->numel(); ++i) {
            // Output index -> source indices along the axis.
            int64_t idx[4] = {};
            Shape full = s;
            full[axis] = 1;
            unravel(full, i, idx);
            double acc = is_max ? -INFINITY : 0.0, mag = 0.0;
            for (int64_t r = 0; r < s[axis]; ++r) {
              idx[axis] = r;
              float v = load(x, offset(x, idx));
              acc = is_max ? std::max(acc, double(v)) : acc + v;
              mag += std::fabs(v);
            }
            ASSERT_NEAR(at(d1, i), acc, is_max ? 0.0 : 1e-6 * mag)
                << op_name(op) << " axis " << axis;
            ASSERT_TRUE(same_bits(at(d1, i), at(d2, i))) << op_name(op) << " axis " << axis;
          }
        }
      }
    }
  }
}

TEST(KernelsReduce, MaxPropagatesNaNAndArgmaxTakesFirst) {
  Nodes ns;
  TensorNode* x = ns.make(f32, {3, 5});
  const float v[] = {1, 3, 3, 2, 0, kReduceNaN, 1, 9, kReduceNaN, 2, -1, -1, -1, -1, -1};
  for (int i = 0; i < 15; ++i) set(x, i, v[i]);
  TensorNode* m = ns.op(Op::MAX, f32, {3}, {x}, axis_params(1, false));
  run(cpu::kernel_MAX, m, 2);
  EXPECT_EQ(at(m, 0), 3.0f);
  EXPECT_TRUE(std::isnan(at(m, 1)));
  EXPECT_EQ(at(m, 2), -1.0f);
  TensorNode* ma = ns.op(Op::MAX, f32, {}, {x}, axis_params(-1, false));
  run(cpu::kernel_MAX, ma, 2);
  EXPECT_TRUE(std::isnan(at(ma, 0)));
  TensorNode* am = ns.op(Op::ARGMAX, i32, {3, 1}, {x}, axis_params(1, true));
  run(cpu::kernel_ARGMAX, am, 2);
  EXPECT_EQ(((int32_t*)am->data)[0], 1);
  EXPECT_EQ(((int32_t*)am->data)[1], 0);
  EXPECT_EQ(((int32_t*)am->data)[2], 0);
  // i32 input.
  TensorNode* xi = ns.make(i32, {2, 4});
  const float iv[] = {5, -2, 7, 7, -9, -3, -3, -8};
  for (int i = 0; i < 8; ++i) set(xi, i, iv[i]);
  TensorNode* ai = ns.op(Op::ARGMAX, i32, {2}, {xi}, axis_params(1, false));
  run(cpu::kernel_ARGMAX, ai, 1);
  EXPECT_EQ(((int32_t*)ai->data)[0], 2);
  EXPECT_EQ(((int32_t*)ai->data)[1], 1);
  // Along axis 0 of a transposed view.
  TensorNode* t = ns.transposed(f32, {400, 300});
  fill_random(t, -5, 5, 30);
  TensorNode* a0 = ns.op(Op::ARGMAX, i32, {300}, {t}, axis_params(0, false));
  run(cpu::kernel_ARGMAX, a0, 3);
  for (int64_t c = 0; c < 300; ++c) {
    int64_t best = 0;
    for (int64_t r = 1; r < 400; ++r)
      if (at(t, r * 300 + c) > at(t, best * 300 + c)) best = r;
    ASSERT_EQ(((int32_t*)a0->data)[c], best);
  }
}

TEST(KernelsReduce, CountEqual) {
  for (DType dt : {f32, i32}) {
    Nodes ns;
    TensorNode* a = ns.make(dt, {500, 301});
    TensorNode* b = ns.transposed(dt, {500, 301});
    int64_t want = 0;
    for (int64_t i = 0; i < a->numel(); ++i) {
      set(a, i, float(i % 7));
      set(b, i, float((i * 3) % 5));
      want += (i % 7) == ((i * 3) % 5);
    }
    for (int nth : {1, 2, 3}) {
      TensorNode* d = ns.op(Op::COUNT_EQUAL, i32, {}, {a, b});
      run(cpu::kernel_COUNT_EQUAL, d, nth);
      EXPECT_EQ(((int32_t*)d->data)[0], want) << dtype_name(dt) << " nth " << nth;
    }
  }
}

// ---------------------------------------------------------------- matmul
void check_matmul(DType ta, bool a_t, bool b_t, Shape as, Shape bs, Shape os) {
  Nodes ns;
  TensorNode* a = a_t ? ns.transposed(ta, as) : ns.make(ta, as);
  TensorNode* b = b_t ? ns.transposed(f32, bs) : ns.make(f32, bs);
  fill_random(a, -1, 1, 40);
  fill_random(b, -1, 1, 41);
  const int nd = os.ndim();
  const int64_t M = os[nd - 2], N = os[nd - 1], K = as[as.ndim() - 1];
  std::vector<float> first;
  for (int nth : {1, 2, 3}) {
    TensorNode* d = ns.op(Op::MATMUL, f32, os, {a, b});
    run(cpu::kernel_MATMUL, d, nth);
    std::vector<float> got = values(d);
    if (nth == 1) first = got;
    for (int64_t i = 0; i < d->numel(); ++i) {
      int64_t idx[4] = {};
      unravel(os, i, idx);
      const int64_t m = idx[nd - 2], n = idx[nd - 1];
      double acc = 0;
      for (int64_t k = 0; k < K; ++k) {
        int64_t ia[4], ib[4];
        std::copy(idx, idx + 4, ia);
        std::copy(idx, idx + 4, ib);
        ia[nd - 2] = m, ia[nd - 1] = k;
        ib[nd - 2] = k, ib[nd - 1] = n;
        // Right-align the batch dims of a and b against the output's.
        int64_t ja[4] = {}, jb[4] = {};
        for (int dd = 0; dd < as.ndim(); ++dd)
          ja[dd] = as[dd] == 1 && dd < as.ndim() - 2 ? 0 : ia[dd + nd - as.ndim()];
        for (int dd = 0; dd < bs.ndim(); ++dd)
          jb[dd] = bs[dd] == 1 && dd < bs.ndim() - 2 ? 0 : ib[dd + nd - bs.ndim()];
        acc += double(load(a, offset(a, ja))) * load(b, offset(b, jb));
      }
      ASSERT_NEAR(got[size_t(i)], acc, 1e-4 * (1 + std::sqrt(double(K))))
          << "i=" << i << " M" << M << " N" << N;
      ASSERT_TRUE(same_bits(got[size_t(i)], first[size_t(i)])) << "nth=" << nth;
    }
  }
}

TEST(KernelsMatmul, BatchedBroadcastTransposedAndHalf) {
  check_matmul(f32, false, false, {70, 130}, {130, 90}, {70, 90});
  check_matmul(f32, true, true, {2, 3, 17, 33}, {3, 33, 19}, {2, 3, 17, 19});
  check_matmul(f16, false, true, {4, 1, 5, 64}, {1, 6, 64, 7}, {4, 6, 5, 7});
  check_matmul(bf16, true, false, {8, 96, 80}, {80, 72}, {8, 96, 72});
  check_matmul(f32, false, false, {1, 200}, {200, 1}, {1, 1});
}

}  // namespace
}  // namespace kiln::kernel_test
