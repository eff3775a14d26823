#include "models/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace kiln::models::detail {
namespace {

std::vector<double> plain_inv_freq(double theta, int64_t D) {
  std::vector<double> inv(size_t(D / 2));
  for (int64_t i = 0; i < D / 2; ++i)
    inv[size_t(i)] = 1.0 / std::pow(theta, double(2 * i) / double(D));
  return inv;
}

// Llama 3: wavelengths longer than the original context / low_freq_factor are
// stretched by `factor`, those shorter than original / high_freq_factor kept,
// and the band between blends the two by where the wavelength lies.
void llama3(const RopeScaling& r, std::vector<double>& inv) {
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
}

// YaRN: frequency i keeps its value (extrapolation) below the dim where a
// wavelength makes beta_fast turns over the original context, is divided by
// `factor` (interpolation) above the dim of beta_slow turns, and ramps linearly
// between the two dims (rounded outwards when `truncate`).
void yarn(const RopeScaling& r, double theta, int64_t D, std::vector<double>& inv) {
  const double ctx = double(r.original_max_position_embeddings);
  auto dim_of = [&](double turns) {  // the dim whose wavelength is ctx / turns
    return double(D) * std::log(ctx / (turns * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = dim_of(r.beta_fast), high = dim_of(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(D - 1));
  if (low == high) high += 0.001;  // a step, not a division by zero
  for (size_t i = 0; i < inv.size(); ++i) {
    const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
    inv[i] = inv[i] / r.factor * ramp + inv[i] * (1 - ramp);
  }
}

// transformers' get_mscale: YaRN's attention scale for a context `scale` times longer.
double yarn_mscale(double scale, double m = 1.0) {
  return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
}

}  // namespace

const std::vector<double>& longrope_factors(const LlamaConfig& c, int64_t seq_len) {
  const RopeScaling& r = *c.rope_scaling;
  return seq_len > r.original_max_position_embeddings ? r.long_factor : r.short_factor;
}

std::vector<double> rope_inv_freq(const LlamaConfig& c, int64_t seq_len) {
  const int64_t D = c.rope_dims();
  std::vector<double> inv = plain_inv_freq(c.rope_theta, D);
  if (!c.rope_freq_factors.empty()) {
    if (c.rope_freq_factors.size() != inv.size())
      fail("models", "rope_freqs has ", c.rope_freq_factors.size(), " factors but ", D,
           " rotary dims need ", inv.size());
    for (size_t i = 0; i < inv.size(); ++i) inv[i] /= double(c.rope_freq_factors[i]);
    return inv;
  }
  if (!c.rope_scaling) return inv;
  const RopeScaling& r = *c.rope_scaling;
  switch (r.type) {
    case RopeScaling::Type::llama3: llama3(r, inv); break;
    case RopeScaling::Type::linear:
      for (double& f : inv) f /= r.factor;
      break;
    case RopeScaling::Type::dynamic: {
      // theta * (factor * L / max_pos - (factor - 1)) ^ (D / (D - 2)) for a
      // length L of at least max_position_embeddings (then: theta unchanged).
      const double max_pos = double(c.max_position_embeddings);
      const double L = std::max(double(seq_len), max_pos);
      const double theta = c.rope_theta * std::pow(r.factor * L / max_pos - (r.factor - 1),
                                                   double(D) / double(D - 2));
      inv = plain_inv_freq(theta, D);
      break;
    }
    case RopeScaling::Type::yarn: yarn(r, c.rope_theta, D, inv); break;
    case RopeScaling::Type::longrope: {
      const std::vector<double>& ext = longrope_factors(c, seq_len);
      if (ext.size() != inv.size())
        fail("models", "longrope needs ", inv.size(), " factors (rotary dims / 2), got ",
             ext.size());
      for (size_t i = 0; i < inv.size(); ++i) inv[i] /= ext[i];
      break;
    }
  }
  return inv;
}

double rope_attention_factor(const LlamaConfig& c) {
  if (!c.rope_scaling) return 1.0;
  const RopeScaling& r = *c.rope_scaling;
  if (r.type != RopeScaling::Type::yarn && r.type != RopeScaling::Type::longrope) return 1.0;
  if (r.attention_factor) return *r.attention_factor;
  if (r.type == RopeScaling::Type::yarn)
    return r.mscale != 0 && r.mscale_all_dim != 0
               ? yarn_mscale(r.factor, r.mscale) / yarn_mscale(r.factor, r.mscale_all_dim)
               : yarn_mscale(r.factor);
  if (r.factor <= 1) return 1.0;
  return std::sqrt(1 + std::log(r.factor) / std::log(double(r.original_max_position_embeddings)));
}

void rope_tables(const LlamaConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out) {
  const std::vector<double> inv = rope_inv_freq(c, positions);
  const double scale = rope_attention_factor(c);
  const int64_t D = c.rope_dims(), half = D / 2;
  cos_out.assign(size_t(positions * D), 0.0f);
  sin_out.assign(size_t(positions * D), 0.0f);
  for (int64_t p = 0; p < positions; ++p)
    for (int64_t i = 0; i < D; ++i) {
      const double a = double(p) * inv[size_t(i % half)];
      cos_out[size_t(p * D + i)] = float(std::cos(a) * scale);
      sin_out[size_t(p * D + i)] = float(std::sin(a) * scale);
    }
}

Tensor apply_rope(Tensor x, Tensor cos, Tensor sin) {
  const int64_t T = x.size(1);
  return rotate(x, cos.narrow(0, 0, T), sin.narrow(0, 0, T));
}

Tensor rotate(Tensor x, Tensor cos, Tensor sin) {
  const int64_t D = x.size(3), R = cos.size(cos.ndim() - 1);
  if (R == D) return rope(x, cos, sin);
  return concat(
      {rope(x.narrow(3, 0, R).contiguous(), cos, sin), x.narrow(3, R, D - R).contiguous()}, 3);
}

}  // namespace kiln::models::detail

namespace kiln::models {

const char* rope_scaling_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::llama3: return "llama3";
    case RopeScaling::Type::linear: return "linear";
    case RopeScaling::Type::dynamic: return "dynamic";
    case RopeScaling::Type::yarn: return "yarn";
    case RopeScaling::Type::longrope: return "longrope";
  }
  return "?";
}

}  // namespace kiln::models
