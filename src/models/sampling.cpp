// Sampler: temperature, top-k and top-p over one row of logits. Only what a
// filter needs is sorted (the k best for top-k, a growing prefix for top-p),
// so plain sampling over a large vocabulary costs one pass over the logits.
#include <algorithm>
#include <cmath>

#include "kiln/generate.h"

namespace kiln::models {
namespace {

// Larger logit first; equal logits: lower id first.
bool before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

}  // namespace

Sampler::Sampler(const SamplingConfig& cfg) : cfg_(cfg), rng_(cfg.seed) {
  if (!(cfg.temperature >= 0) || !std::isfinite(cfg.temperature))
    fail("sample", "temperature must be a finite number >= 0, got ", cfg.temperature);
  if (cfg.top_k < 0) fail("sample", "top_k must be >= 0 (0: off), got ", cfg.top_k);
  if (!(cfg.top_p > 0 && cfg.top_p <= 1))
    fail("sample", "top_p must be in (0, 1] (1: off), got ", cfg.top_p);
}

double Sampler::select(std::span<const float> logits) {
  const size_t V = logits.size();
  if (V == 0) fail("sample", "no logits");
  order_.resize(V);
  float mx = -INFINITY;
  for (size_t i = 0; i < V; ++i) {
    order_[i] = {logits[i], int32_t(i)};
    if (std::isnan(logits[i])) fail("sample", "logit ", i, " is NaN");
    mx = std::max(mx, logits[i]);
  }
  if (!std::isfinite(mx)) fail("sample", "the largest logit is ", mx);
  if (cfg_.temperature == 0) {  // greedy: the first largest logit
    const auto it =
        std::find_if(order_.begin(), order_.end(), [&](auto& p) { return p.first == mx; });
    order_ = {*it};
    weight_ = {1.0};
    return 1.0;
  }
  size_t k = V;
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < V) {
    k = size_t(cfg_.top_k);
    std::nth_element(order_.begin(), order_.begin() + std::ptrdiff_t(k), order_.end(), before);
    order_.resize(k);
    std::sort(order_.begin(), order_.end(), before);
  }
  const double inv_t = 1.0 / double(cfg_.temperature);
  weight_.resize(order_.size());
  double sum = 0;
  for (size_t i = 0; i < order_.size(); ++i)
    sum += weight_[i] = std::exp((double(order_[i].first) - double(mx)) * inv_t);
  if (cfg_.top_p >= 1) return sum;
  // The smallest most-likely-first prefix whose probability reaches top_p;
  // sorted in growing prefixes, as it is usually short.
  const double want = double(cfg_.top_p) * sum;
  for (size_t m = std::min<size_t>(64, order_.size());; m = std::min(m * 8, order_.size())) {
    if (k == V) {
      std::partial_sort(order_.begin(), order_.begin() + std::ptrdiff_t(m), order_.end(), before);
      for (size_t i = 0; i < m; ++i)
        weight_[i] = std::exp((double(order_[i].first) - double(mx)) * inv_t);
    }
    double cum = 0;
    for (size_t i = 0; i < m; ++i) {
      cum += weight_[i];
      if (cum >= want) {
        order_.resize(i + 1);
        weight_.resize(i + 1);
        return cum;
      }
    }
    if (m == order_.size()) return sum;  // rounding: keep all
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  const double total = select(logits);
  if (order_.size() == 1) return order_[0].second;
  const double u = double(rng_() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
  double cum = 0;
  for (size_t i = 0; i < order_.size(); ++i) {
    cum += weight_[i];
    if (u < cum) return order_[i].second;
  }
  return order_.back().second;
}

std::vector<std::pair<int32_t, double>> Sampler::candidates(std::span<const float> logits) {
  const double total = select(logits);
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < order_.size(); ++i) out.emplace_back(order_[i].second, weight_[i] / total);
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace kiln::models
