// Param initialisers (kiln/nn/init.h): host-side, deterministic for a seed on
// every platform (std::mt19937_64's raw output, no std:: distributions).
#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "kiln/nn/init.h"

namespace kiln {

namespace {

// Uniform doubles in [0, 1) from the engine's raw output only (std::
// distributions differ between standard libraries).
double unit(std::mt19937_64& rng) { return double(rng() >> 11) * (1.0 / 9007199254740992.0); }

void fill_with(Tensor t, const char* op, const std::function<float()>& f) {
  if (!t.defined()) fail(op, "tensor is undefined");
  if (!t.has_data())
    fail(op, "'", t.name(), "' ", t.shape().str(), " has no memory yet (allocate first)");
  std::vector<float> v(size_t(t.numel()));
  for (float& x : v) x = f();
  if (t.dtype() == f32 || is_quantized(t.dtype())) {
    t.set(v);  // a q8_0 / q4_0 tensor stores the values quantized
    return;
  }
  std::vector<uint16_t> h(v.size());
  if (t.dtype() == f16)
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_f16(v[i]);
  else if (t.dtype() == bf16)
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
  else fail(op, "'", t.name(), "' must be a floating-point tensor, is ", dtype_name(t.dtype()));
  t.set(h);
}

}  // namespace

void init_uniform(Tensor t, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  fill_with(t, "init_uniform", [&] { return float(lo + (double(hi) - lo) * unit(rng)); });
}

void init_normal(Tensor t, float mean, float stddev, uint64_t seed) {
  std::mt19937_64 rng(seed);
  // Box-Muller on raw engine output (platform-independent).
  bool have = false;
  double spare = 0;
  fill_with(t, "init_normal", [&] {
    if (have) {
      have = false;
      return float(mean + stddev * spare);
    }
    double u1 = unit(rng), u2 = unit(rng);
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)), a = 2.0 * M_PI * u2;
    spare = r * std::sin(a);
    have = true;
    return float(mean + stddev * r * std::cos(a));
  });
}

void kaiming_uniform(Tensor t, int64_t fan_in, uint64_t seed, float gain) {
  if (fan_in <= 0) fail("kaiming_uniform", "fan_in must be positive, got ", fan_in);
  const float b = float(gain * std::sqrt(3.0 / double(fan_in)));
  init_uniform(t, -b, b, seed);
}

void xavier_uniform(Tensor t, int64_t fan_in, int64_t fan_out, uint64_t seed, float gain) {
  if (fan_in <= 0 || fan_out <= 0)
    fail("xavier_uniform", "fan_in and fan_out must be positive, got ", fan_in, " and ", fan_out);
  const float b = float(gain * std::sqrt(6.0 / double(fan_in + fan_out)));
  init_uniform(t, -b, b, seed);
}

}  // namespace kiln
