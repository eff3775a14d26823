// Double-precision references of the nn layers, written from their definitions
// (PyTorch's formulas), independent of kiln's kernels.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace kiln::test::ref {

using V = std::vector<double>;

// x [n, in], w [out, in], b [out] (empty: none) -> [n, out].
inline V linear(const V& x, int64_t n, int64_t in, const V& w, const V& b, int64_t out) {
  V y(size_t(n * out));
  for (int64_t r = 0; r < n; ++r)
    for (int64_t o = 0; o < out; ++o) {
      double s = b.empty() ? 0.0 : b[size_t(o)];
      for (int64_t i = 0; i < in; ++i) s += x[size_t(r * in + i)] * w[size_t(o * in + i)];
      y[size_t(r * out + o)] = s;
    }
  return y;
}

// Over rows of length d; w, b empty: none.
inline V layer_norm(const V& x, int64_t d, const V& w, const V& b, double eps) {
  V y(x.size());
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double mu = 0, var = 0;
    for (int64_t i = 0; i < d; ++i) mu += x[r * d + i];
    mu /= double(d);
    for (int64_t i = 0; i < d; ++i) var += (x[r * d + i] - mu) * (x[r * d + i] - mu);
    var /= double(d);
    for (int64_t i = 0; i < d; ++i) {
      double v = (x[r * d + i] - mu) / std::sqrt(var + eps);
      if (!w.empty()) v *= w[size_t(i)];
      if (!b.empty()) v += b[size_t(i)];
      y[r * d + i] = v;
    }
  }
  return y;
}

inline V rms_norm(const V& x, int64_t d, const V& w, double eps) {
  V y(x.size());
  for (size_t r = 0; r < x.size() / size_t(d); ++r) {
    double ms = 0;
    for (int64_t i = 0; i < d; ++i) ms += x[r * d + i] * x[r * d + i];
    const double inv = 1.0 / std::sqrt(ms / double(d) + eps);
    for (int64_t i = 0; i < d; ++i)
      y[r * d + i] = x[r * d + i] * inv * (w.empty() ? 1.0 : w[size_t(i)]);
  }
  return y;
}

inline V gelu(V x) {
  for (double& v : x) v = 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
  return x;
}

// x [N, C, H, W], w [O, C, K, K], b [O]; stride s, padding p.
inline V conv2d(const V& x, int64_t N, int64_t C, int64_t H, int64_t W, const V& w, const V& b,
                int64_t O, int64_t K, int64_t s, int64_t p, int64_t* OH_out, int64_t* OW_out) {
  const int64_t OH = (H + 2 * p - K) / s + 1, OW = (W + 2 * p - K) / s + 1;
  *OH_out = OH;
  *OW_out = OW;
  V y(size_t(N * O * OH * OW));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t o = 0; o < O; ++o)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          double acc = b.empty() ? 0.0 : b[size_t(o)];
          for (int64_t c = 0; c < C; ++c)
            for (int64_t kh = 0; kh < K; ++kh)
              for (int64_t kw = 0; kw < K; ++kw) {
                const int64_t ih = oh * s - p + kh, iw = ow * s - p + kw;
                if (ih < 0 || ih >= H || iw < 0 || iw >= W) continue;
                acc += x[size_t(((n * C + c) * H + ih) * W + iw)] *
                       w[size_t(((o * C + c) * K + kh) * K + kw)];
              }
          y[size_t(((n * O + o) * OH + oh) * OW + ow)] = acc;
        }
  return y;
}

// nanoGPT attention on x [B, T, C] with c_attn (wa [3C, C], ba) and c_proj (wp, bp).
inline V causal_self_attention(const V& x, int64_t B, int64_t T, int64_t C, int64_t H, const V& wa,
                               const V& ba, const V& wp, const V& bp) {
  const int64_t D = C / H;
  const V qkv = linear(x, B * T, C, wa, ba, 3 * C);  // [B*T, 3C]
  V y(size_t(B * T * C));
  const double scale = 1.0 / std::sqrt(double(D));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < T; ++i) {
        auto at = [&](int64_t t, int part, int64_t d) {
          return qkv[size_t((b * T + t) * 3 * C + part * C + h * D + d)];
        };
        std::vector<double> s(size_t(i + 1));
        double mx = -1e300;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += at(i, 0, d) * at(j, 1, d);
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        double z = 0;
        for (double& v : s) z += (v = std::exp(v - mx));
        for (int64_t d = 0; d < D; ++d) {
          double acc = 0;
          for (int64_t j = 0; j <= i; ++j) acc += s[size_t(j)] / z * at(j, 2, d);
          y[size_t((b * T + i) * C + h * D + d)] = acc;
        }
      }
  return linear(y, B * T, C, wp, bp, C);
}

}  // namespace kiln::test::ref
