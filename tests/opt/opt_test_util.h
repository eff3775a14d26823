// Shared helpers of the training tests: a synthetic classification data set
// (three Gaussian blobs in the plane, plus a nonlinear ring class) and a small
// MLP built in its own Context, so tests can build the same model twice.
#pragma once
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "kiln/kiln.h"
#include "kiln/opt.h"

namespace kiln::test {

inline constexpr int kFeatures = 2;
inline constexpr int kClasses = 3;

// n samples: class c is a blob around angle 2*pi*c/3 at radius 1.2 (sd 0.35).
inline Dataset make_blobs(int64_t n, uint64_t seed) {
  Dataset ds(n, {kFeatures}, DataType::f32, {}, DataType::i32, 1);
  std::mt19937_64 rng(seed);
  auto unit = [&] { return double(rng() >> 11) * (1.0 / 9007199254740992.0); };
  auto normal = [&] {
    const double u1 = std::max(unit(), 1e-300), u2 = unit();
    return std::sqrt(-2 * std::log(u1)) * std::cos(2 * M_PI * u2);
  };
  auto x = ds.data<float>();
  auto y = ds.labels<int32_t>();
  for (int64_t i = 0; i < n; ++i) {
    const int c = int(i % kClasses);
    const double a = 2 * M_PI * c / kClasses;
    x[size_t(2 * i)] = float(1.2 * std::cos(a) + 0.35 * normal());
    x[size_t(2 * i + 1)] = float(1.2 * std::sin(a) + 0.35 * normal());
    y[size_t(i)] = c;
  }
  return ds;
}

// A 2 -> hidden (tanh) -> 3 MLP with physical batch B, initialised with `seed`
// once the OptContext made it (call init() after constructing the context);
// its matmuls are built under the given matmul precision.
struct Mlp {
  explicit Mlp(int64_t B, int64_t hidden = 16, DType precision = f32) {
    ctx->set_matmul_precision(precision);
    x = ctx->input(f32, {B, kFeatures}, "x");
    w1 = ctx->param(f32, {kFeatures, hidden}, "w1");
    b1 = ctx->param(f32, {hidden}, "b1");
    w2 = ctx->param(f32, {hidden, kClasses}, "w2");
    b2 = ctx->param(f32, {kClasses}, "b2");
    logits = matmul(tanh(matmul(x, w1) + b1), w2) + b2;
  }
  void init(uint64_t seed) {
    xavier_uniform(w1, kFeatures, w1.size(1), seed);
    xavier_uniform(w2, w2.size(0), kClasses, seed + 1);
    b1.fill_zero();
    b2.fill_zero();
  }
  OptConfig config(int64_t logical = 0) const {
    OptConfig c;
    c.inputs = x;
    c.outputs = logits;
    c.logical_batch = logical;
    c.n_threads = 1;
    return c;
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }

  std::unique_ptr<Context> ctx = std::make_unique<Context>();
  Tensor x, w1, b1, w2, b2, logits;
};

inline std::vector<float> values(Tensor t) { return t.get<float>(); }

inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = a.size() == b.size() ? 0.0 : INFINITY;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

}  // namespace kiln::test
