// The bulk dtype conversions of kernels/common.h (vector bodies per
// instruction set, scalar tails) give the scalar conversions' bits for every
// length and for special values: NaN (quieted by f32 -> bf16), infinities,
// the largest finite f32 (rounds to infinity), subnormals, signed zeros, ties.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "backends/cpu/kernels/common.h"

namespace {

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// n floats: random normal values with the special ones spread among them.
std::vector<float> test_values(int64_t n, std::mt19937& rng) {
  const float specials[] = {std::nanf(""),
                            -std::nanf(""),
                            from_bits(0x7f800001u),
                            INFINITY,
                            -INFINITY,
                            3.4028235e38f,
                            1e-39f,
                            -1e-39f,
                            0.0f,
                            -0.0f,
                            1.00390625f,
                            1.01171875f,
                            -65535.5f,
                            from_bits(0x3f808000u)};
  std::normal_distribution<float> d(0.0f, 3.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    v[size_t(i)] = i % 3 == 1 ? specials[size_t(i / 3) % std::size(specials)] : d(rng);
  return v;
}

}  // namespace

TEST(Convert, BulkF32ToBf16AndBackMatchScalar) {
  std::mt19937 rng(11);
  for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 33, 100}) {
    const std::vector<float> x = test_values(n, rng);
    std::vector<uint16_t> h(size_t(n) + 1, 0xabcd);
    kiln::cpu::f32_to_bf16_n(x.data(), h.data(), n);
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(h[size_t(i)], kiln::f32_to_bf16(x[size_t(i)])) << "n " << n << " i " << i;
    EXPECT_EQ(h[size_t(n)], 0xabcd) << "wrote past n = " << n;

    std::vector<float> back(size_t(n) + 1, 7.0f);
    kiln::cpu::bf16_to_f32_n(h.data(), back.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      const float want = kiln::bf16_to_f32(h[size_t(i)]);
      ASSERT_EQ(std::memcmp(&back[size_t(i)], &want, 4), 0) << "n " << n << " i " << i;
    }
    EXPECT_EQ(back[size_t(n)], 7.0f) << "wrote past n = " << n;
  }
}
