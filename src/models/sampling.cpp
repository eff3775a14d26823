// Sampler: logit bias, penalties, temperature, top-k, top-p and min-p over one
// row of logits (the order: kiln/sampling.h). Only what a filter needs is
// sorted (the k best for top-k, a growing prefix for top-p), so plain sampling
// over a large vocabulary costs one pass over the logits; the penalties touch
// only the tokens of the history window.
#include <algorithm>
#include <cmath>

#include "kiln/error.h"
#include "kiln/sampling.h"

namespace kiln::models {
namespace {

// Larger logit first; equal logits: lower id first.
bool before(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

void check_config(const SamplingConfig& c) {
  if (!(c.temperature >= 0) || !std::isfinite(c.temperature))
    fail("sample", "temperature must be a finite number >= 0, got ", c.temperature);
  if (c.top_k < 0) fail("sample", "top_k must be >= 0 (0: off), got ", c.top_k);
  if (!(c.top_p > 0 && c.top_p <= 1))
    fail("sample", "top_p must be in (0, 1] (1: off), got ", c.top_p);
  if (!(c.min_p >= 0 && c.min_p <= 1))
    fail("sample", "min_p must be in [0, 1] (0: off), got ", c.min_p);
  if (!(c.repetition_penalty > 0) || !std::isfinite(c.repetition_penalty))
    fail("sample", "repetition_penalty must be a finite number > 0 (1: off), got ",
         c.repetition_penalty);
  if (!std::isfinite(c.presence_penalty))
    fail("sample", "presence_penalty must be finite, got ", c.presence_penalty);
  if (!std::isfinite(c.frequency_penalty))
    fail("sample", "frequency_penalty must be finite, got ", c.frequency_penalty);
  if (c.penalty_last_n < 0)
    fail("sample", "penalty_last_n must be >= 0 (0: the whole history), got ", c.penalty_last_n);
  for (const auto& [id, bias] : c.logit_bias) {
    if (id < 0) fail("sample", "logit_bias names token ", id, ", which is negative");
    if (std::isnan(bias) || bias == INFINITY)
      fail("sample", "logit_bias of token ", id, " is ", bias, " (finite or -inf, which bans it)");
  }
}

}  // namespace

Sampler::Sampler(const SamplingConfig& cfg) : cfg_(cfg), rng_(cfg.seed) { check_config(cfg_); }

void Sampler::set_prompt(std::span<const int32_t> ids) {
  history_.clear();
  window_begin_ = 0;
  seen_.clear();
  generated_.clear();
  for (int32_t id : ids) push(id, false);
}

void Sampler::accept(int32_t id) { push(id, true); }

void Sampler::push(int32_t id, bool generated) {
  if (!cfg_.has_penalties()) return;  // nothing reads the history
  history_.emplace_back(id, generated);
  ++seen_[id];
  if (generated) ++generated_[id];
  const size_t n = size_t(cfg_.penalty_last_n);
  if (n > 0 && history_.size() - window_begin_ > n) {  // the oldest leaves the window
    const auto [old, was_generated] = history_[window_begin_++];
    if (--seen_[old] == 0) seen_.erase(old);
    if (was_generated && --generated_[old] == 0) generated_.erase(old);
    if (window_begin_ > 4096 && window_begin_ * 2 > history_.size()) {
      history_.erase(history_.begin(), history_.begin() + std::ptrdiff_t(window_begin_));
      window_begin_ = 0;
    }
  }
}

double Sampler::select(std::span<const float> logits) {
  const size_t V = logits.size();
  if (V == 0) fail("sample", "no logits");
  order_.resize(V);
  for (size_t i = 0; i < V; ++i) {
    if (std::isnan(logits[i])) fail("sample", "logit ", i, " is NaN");
    order_[i] = {logits[i], int32_t(i)};
  }
  // 1. bias, 2. penalties: order_ is still indexed by id.
  for (const auto& [id, bias] : cfg_.logit_bias) {
    if (size_t(id) >= V)
      fail("sample", "logit_bias names token ", id, ", outside the vocabulary of ", V);
    order_[size_t(id)].first += bias;
  }
  const float rep = cfg_.repetition_penalty;
  if (rep != 1.0f)
    for (const auto& [id, count] : seen_)
      if (id >= 0 && size_t(id) < V) {
        float& l = order_[size_t(id)].first;
        l = l > 0 ? l / rep : l * rep;
      }
  if (cfg_.presence_penalty != 0.0f || cfg_.frequency_penalty != 0.0f)
    for (const auto& [id, count] : generated_)
      if (id >= 0 && size_t(id) < V)
        order_[size_t(id)].first -= cfg_.presence_penalty + cfg_.frequency_penalty * float(count);
  float mx = -INFINITY;
  for (const auto& [l, id] : order_) mx = std::max(mx, l);
  if (mx == -INFINITY) fail("sample", "every token is banned (all logits are -inf)");
  if (!std::isfinite(mx)) fail("sample", "the largest logit is ", mx);
  if (cfg_.temperature == 0) {  // 3. greedy: the first largest
    const auto it =
        std::find_if(order_.begin(), order_.end(), [&](auto& p) { return p.first == mx; });
    order_ = {*it};
    weight_ = {1.0};
    return 1.0;
  }
  size_t k = V;
  if (cfg_.top_k > 0 && size_t(cfg_.top_k) < V) {  // 4.
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
  if (cfg_.top_p < 1) {  // 5.
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
      size_t keep = 0;
      for (size_t i = 0; i < m && keep == 0; ++i)
        if ((cum += weight_[i]) >= want) keep = i + 1;
      if (keep > 0) {
        order_.resize(keep);
        weight_.resize(keep);
        sum = cum;
        break;
      }
      if (m == order_.size()) break;  // rounding: keep all
    }
  }
  // 6. min-p (the largest weight is exactly 1), and tokens of weight 0 (banned,
  // or too unlikely for a double), which a draw can never pick.
  const double floor_w = double(cfg_.min_p);
  size_t out = 0;
  double kept = 0;
  for (size_t i = 0; i < order_.size(); ++i)
    if (weight_[i] > 0 && weight_[i] >= floor_w) {
      order_[out] = order_[i];
      kept += weight_[out++] = weight_[i];
    }
  if (out < order_.size()) {
    order_.resize(out);
    weight_.resize(out);
    sum = kept;
  }
  return sum;
}

int32_t Sampler::sample(std::span<const float> logits) {
  const double total = select(logits);
  int32_t id = order_.back().second;
  if (order_.size() == 1) {
    id = order_[0].second;
  } else {                                                      // 7.
    const double u = double(rng_() >> 11) * 0x1.0p-53 * total;  // uniform in [0, total)
    double cum = 0;
    for (size_t i = 0; i < order_.size(); ++i)
      if (u < (cum += weight_[i])) {
        id = order_[i].second;
        break;
      }
  }
  accept(id);
  return id;
}

std::vector<std::pair<int32_t, double>> Sampler::candidates(std::span<const float> logits) {
  const double total = select(logits);
  std::vector<std::pair<int32_t, double>> out;
  for (size_t i = 0; i < order_.size(); ++i) out.emplace_back(order_[i].second, weight_[i] / total);
  std::stable_sort(out.begin(), out.end(), [](auto& a, auto& b) { return a.second > b.second; });
  return out;
}

}  // namespace kiln::models
