// Initialising a param whose dtype is quantized (q8_0 / q4_0, e.g. a benchmark's
// random base for QLoRA): init() writes the same random values as for f32,
// stored quantized, so they come back within half a quantization step.
#include <gtest/gtest.h>

#include <cmath>

#include "nn_test_util.h"

namespace kiln {
namespace {

TEST(InitQuantized, LinearWeightIsTheF32InitQuantized) {
  for (DType q : {q8_0, q4_0}) {
    Context ctx;
    CpuBackend cpu(1);
    nn::Linear f32_fc(ctx, 64, 8), q_fc(ctx, 64, 8);
    q_fc.set_parameter_dtype("weight", q);
    f32_fc.allocate(cpu);
    q_fc.allocate(cpu);
    f32_fc.init(7);
    q_fc.init(7);
    const std::vector<float> want = f32_fc.weight().get<float>(), got = q_fc.weight().get<float>();
    ASSERT_EQ(got.size(), want.size());
    // Per block of 32: step = max|w| / 127 (q8_0) or max|w| / 8 (q4_0); q8_0
    // rounds to the nearest step, q4_0's levels -8..7 clamp the side opposite
    // the largest value, a full step at most.
    for (size_t b = 0; b < want.size(); b += 32) {
      float amax = 0;
      for (size_t i = b; i < b + 32; ++i) amax = std::max(amax, std::fabs(want[i]));
      const float bound = q == q8_0 ? amax / 127 * 0.5f : amax / 8;
      for (size_t i = b; i < b + 32; ++i)
        EXPECT_LE(std::fabs(got[i] - want[i]), bound + 1e-3f * amax) << dtype_name(q) << " " << i;
    }
    EXPECT_NE(got, std::vector<float>(got.size(), 0.0f));
  }
}

}  // namespace
}  // namespace kiln
