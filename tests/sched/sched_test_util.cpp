#include "sched_test_util.h"

#include <algorithm>

namespace sched_test {

Model make_mlp(int64_t batch, int64_t in, int64_t hidden, int64_t classes) {
  Model m;
  Context& c = *m.ctx;
  m.x = c.input(f32, {batch, in}, "x");
  m.labels = c.input(i32, {batch}, "labels");
  Tensor w1 = c.param(f32, {in, hidden}, "w1"), b1 = c.param(f32, {hidden}, "b1");
  Tensor w2 = c.param(f32, {hidden, classes}, "w2"), b2 = c.param(f32, {classes}, "b2");
  m.params = {w1, b1, w2, b2};
  Tensor h = relu(matmul(m.x, w1) + b1).set_name("h");
  m.logits = (matmul(h, w2) + b2).set_name("logits");
  m.loss = cross_entropy(m.logits, m.labels).set_name("loss");
  m.graph = Graph::forward({m.loss, m.logits});
  m.graph.backward(m.loss);
  return m;
}

Model make_cnn(int64_t batch, int64_t channels, int64_t hw, int64_t classes) {
  Model m;
  Context& c = *m.ctx;
  const int64_t f1 = 4, f2 = 6;
  m.x = c.input(f32, {batch, channels, hw, hw}, "x");
  m.labels = c.input(i32, {batch}, "labels");
  Tensor k1 = c.param(f32, {f1, channels, 3, 3}, "k1"), c1 = c.param(f32, {f1}, "c1");
  Tensor k2 = c.param(f32, {f2, f1, 3, 3}, "k2"), c2 = c.param(f32, {f2}, "c2");
  const int64_t pooled = hw / 2, feat = f2 * (pooled - 2) * (pooled - 2);
  Tensor w = c.param(f32, {feat, classes}, "w"), b = c.param(f32, {classes}, "b");
  m.params = {k1, c1, k2, c2, w, b};
  Conv2dOptions pad1;
  pad1.padding[0] = pad1.padding[1] = 1;
  Tensor h = max_pool2d(relu(conv2d(m.x, k1, c1, pad1)));
  h = relu(conv2d(h, k2, c2));
  m.logits = (matmul(h.reshape({batch, feat}), w) + b).set_name("logits");
  m.loss = cross_entropy(m.logits, m.labels).set_name("loss");
  m.graph = Graph::forward({m.loss, m.logits});
  m.graph.backward(m.loss);
  return m;
}

void fill(Model& m, uint32_t seed) {
  uint32_t state = seed * 2654435761u + 12345u;
  auto next = [&] {
    return float((state = state * 1664525u + 1013904223u) >> 8) / float(1 << 24) - 0.5f;
  };
  auto rand = [&](Tensor t, float scale) {
    std::vector<float> v(size_t(t.numel()));
    for (float& f : v) f = next() * scale;
    t.set(v);
  };
  rand(m.x, 2.0f);
  for (Tensor p : m.params)
    rand(p, 1.0f / std::sqrt(float(std::max<int64_t>(p.numel() / p.size(-1), 1))));
  std::vector<int32_t> lab(size_t(m.labels.numel()));
  const int64_t classes = m.logits.size(-1);
  for (size_t i = 0; i < lab.size(); ++i) lab[i] = int32_t((i * 7 + seed) % size_t(classes));
  m.labels.set(lab);
}

std::vector<float> values(Tensor t) { return t.get<float>(); }

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 1e30;
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, double(std::fabs(a[i])));
    diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  }
  return scale == 0 ? diff : diff / scale;
}

}  // namespace sched_test
