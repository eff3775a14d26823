// Reference: LAYER_NORM, LAYER_NORM_BACK, LAYER_NORM_BACK_AFFINE, RMS_NORM,
// RMS_NORM_BACK and RMS_NORM_BACK_WEIGHT, in double, written from their
// definitions in ops.def: plain loops over rows.
#include <cmath>

#include "ops/reference/reference.h"

namespace kiln::test {

namespace {

struct Norm {
  std::vector<double> xhat;  // row-major like x
  std::vector<double> rstd;  // per row
};

Norm normalise(const RefValue& x, double eps) {
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  Norm n{std::vector<double>(x.v.size()), std::vector<double>(size_t(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.v.data() + r * d;
    double mean = 0, var = 0;
    for (int64_t j = 0; j < d; ++j) mean += xr[j];
    mean /= double(d);
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= double(d);
    const double rs = 1.0 / std::sqrt(var + eps);
    n.rstd[size_t(r)] = rs;
    for (int64_t j = 0; j < d; ++j) n.xhat[size_t(r * d + j)] = (xr[j] - mean) * rs;
  }
  return n;
}

// xhat = x / sqrt(mean(x^2) + eps) per row.
Norm rms_normalise(const RefValue& x, double eps) {
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  Norm n{std::vector<double>(x.v.size()), std::vector<double>(size_t(rows))};
  for (int64_t r = 0; r < rows; ++r) {
    const double* xr = x.v.data() + r * d;
    double ms = 0;
    for (int64_t j = 0; j < d; ++j) ms += xr[j] * xr[j];
    const double rs = 1.0 / std::sqrt(ms / double(d) + eps);
    n.rstd[size_t(r)] = rs;
    for (int64_t j = 0; j < d; ++j) n.xhat[size_t(r * d + j)] = xr[j] * rs;
  }
  return n;
}

}  // namespace

RefValue ref_LAYER_NORM(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const LayerNormParams p = a.params<LayerNormParams>();
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1];
  int i = 1;
  const RefValue* w = p.has_weight ? &a.in(i++) : nullptr;
  const RefValue* b = p.has_bias ? &a.in(i++) : nullptr;
  for (size_t k = 0; k < r.v.size(); ++k) {
    const size_t j = k % size_t(d);
    r.v[k] = n.xhat[k] * (w ? w->v[j] : 1.0) + (b ? b->v[j] : 0.0);
  }
  return r;
}

// dx = rstd * (g - mean(g) - xhat * mean(g xhat)), g = dy * w.
RefValue ref_LAYER_NORM_BACK(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const LayerNormParams p = a.params<LayerNormParams>();
  const RefValue* w = p.has_weight ? &a.in(2) : nullptr;
  const RefValue* res = p.has_residual ? &a.in(2 + int(p.has_weight)) : nullptr;
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  for (int64_t row = 0; row < rows; ++row) {
    double sg = 0, sgx = 0;
    std::vector<double> g(static_cast<size_t>(d));
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      g[size_t(j)] = dy.v[k] * (w ? w->v[size_t(j)] : 1.0);
      sg += g[size_t(j)];
      sgx += g[size_t(j)] * n.xhat[k];
    }
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      r.v[k] = n.rstd[size_t(row)] * (g[size_t(j)] - sg / double(d) - n.xhat[k] * sgx / double(d)) +
               (res ? res->v[k] : 0.0);
    }
  }
  return r;
}

RefValue ref_LAYER_NORM_BACK_AFFINE(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const int64_t d = x.shape[x.shape.ndim() - 1];
  RefValue r = ref_out(a.node, Shape{2, d});
  const Norm n = normalise(x, double(a.params<LayerNormParams>().eps));
  for (size_t k = 0; k < x.v.size(); ++k) {
    r.v[k % size_t(d)] += dy.v[k] * n.xhat[k];
    r.v[size_t(d) + k % size_t(d)] += dy.v[k];
  }
  return r;
}

RefValue ref_RMS_NORM(const RefArgs& a) {
  const RefValue& x = a.in(0);
  const RmsNormParams p = a.params<RmsNormParams>();
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = rms_normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1];
  const RefValue* w = p.has_weight ? &a.in(1) : nullptr;
  for (size_t k = 0; k < r.v.size(); ++k) r.v[k] = n.xhat[k] * (w ? w->v[k % size_t(d)] : 1.0);
  return r;
}

// dx = rstd * (g - xhat * mean(g xhat)), g = dy * w.
RefValue ref_RMS_NORM_BACK(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const RmsNormParams p = a.params<RmsNormParams>();
  const RefValue* w = p.has_weight ? &a.in(2) : nullptr;
  const RefValue* res = p.has_residual ? &a.in(2 + int(p.has_weight)) : nullptr;
  RefValue r = ref_out(a.node, x.shape);
  const Norm n = rms_normalise(x, double(p.eps));
  const int64_t d = x.shape[x.shape.ndim() - 1], rows = d ? x.numel() / d : 0;
  for (int64_t row = 0; row < rows; ++row) {
    std::vector<double> g(static_cast<size_t>(d));
    double sgx = 0;
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      g[size_t(j)] = dy.v[k] * (w ? w->v[size_t(j)] : 1.0);
      sgx += g[size_t(j)] * n.xhat[k];
    }
    for (int64_t j = 0; j < d; ++j) {
      const size_t k = size_t(row * d + j);
      r.v[k] = n.rstd[size_t(row)] * (g[size_t(j)] - n.xhat[k] * sgx / double(d)) +
               (res ? res->v[k] : 0.0);
    }
  }
  return r;
}

RefValue ref_RMS_NORM_BACK_WEIGHT(const RefArgs& a) {
  const RefValue &dy = a.in(0), &x = a.in(1);
  const int64_t d = x.shape[x.shape.ndim() - 1];
  RefValue r = ref_out(a.node, Shape{d});
  const Norm n = rms_normalise(x, double(a.params<RmsNormParams>().eps));
  for (size_t k = 0; k < x.v.size(); ++k) r.v[k % size_t(d)] += dy.v[k] * n.xhat[k];
  return r;
}

}  // namespace kiln::test
