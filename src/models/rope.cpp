#include "models/rope.h"

#include <cmath>
#include <numbers>

namespace kiln::models::detail {

std::vector<double> rope_inv_freq(const LlamaConfig& c) {
  const int64_t half = c.head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[size_t(i)] = 1.0 / std::pow(c.rope_theta, double(2 * i) / double(c.head_dim));
  if (!c.rope_freq_factors.empty()) {
    if (c.rope_freq_factors.size() != inv.size())
      fail("models", "rope_freqs has ", c.rope_freq_factors.size(), " factors but head_dim ",
           c.head_dim, " needs ", inv.size());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= double(c.rope_freq_factors[i]);
    return inv;
  }
  if (!c.rope_scaling) return inv;
  // Llama 3: wavelengths longer than the original context / low_freq_factor are
  // stretched by `factor`, those shorter than original / high_freq_factor kept,
  // and the band between blends the two by where the wavelength lies.
  const RopeScaling& r = *c.rope_scaling;
  const double old_len = double(r.original_max_position_embeddings);
  const double low_wavelen = old_len / r.low_freq_factor;
  const double high_wavelen = old_len / r.high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f /= r.factor;
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f = (1 - smooth) * f / r.factor + smooth * f;
    }
  }
  return inv;
}

void rope_tables(const LlamaConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out) {
  const std::vector<double> inv = rope_inv_freq(c);
  const int64_t D = c.head_dim, half = D / 2;
  cos_out.assign(size_t(positions * D), 0.0f);
  sin_out.assign(size_t(positions * D), 0.0f);
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < D; ++i) {
      const double a = double(p) * inv[size_t(i % half)];
      cos_out[size_t(p * D + i)] = float(std::cos(a));
      sin_out[size_t(p * D + i)] = float(std::sin(a));
    }
}

Tensor apply_rope(Tensor x, Tensor cos, Tensor sin) {
  const int64_t T = x.size(1);
  return rope(x, cos.narrow(0, 0, T), sin.narrow(0, 0, T));
}

}  // namespace kiln::models::detail
