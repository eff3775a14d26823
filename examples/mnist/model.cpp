#include "model.h"

#include <cmath>

#include "kiln/opt.h"

namespace mnist {

namespace {

kiln::Tensor param(Model& m, const kiln::Shape& s, const std::string& name) {
  kiln::Tensor t = m.ctx->param(kiln::f32, s, name);
  m.params.push_back(t);
  return t;
}

}  // namespace

Model Model::build(const std::string& kind, int64_t B) {
  Model m;
  m.kind = kind;
  kiln::Context& ctx = *m.ctx;
  if (kind == "fc") {
    m.images = ctx.input(kiln::f32, {B, 784}, "images");
    kiln::Tensor w1 = param(m, {784, 500}, "fc1.weight"), b1 = param(m, {500}, "fc1.bias");
    kiln::Tensor w2 = param(m, {500, 10}, "fc2.weight"), b2 = param(m, {10}, "fc2.bias");
    m.logits = kiln::matmul(kiln::relu(kiln::matmul(m.images, w1) + b1), w2) + b2;
  } else if (kind == "cnn") {
    m.images = ctx.input(kiln::f32, {B, 1, 28, 28}, "images");
    kiln::Tensor k1 = param(m, {8, 1, 3, 3}, "conv1.weight"), c1 = param(m, {8}, "conv1.bias");
    kiln::Tensor k2 = param(m, {16, 8, 3, 3}, "conv2.weight"), c2 = param(m, {16}, "conv2.bias");
    kiln::Tensor w = param(m, {784, 10}, "dense.weight"), b = param(m, {10}, "dense.bias");
    kiln::Conv2dOptions pad1;
    pad1.padding[0] = pad1.padding[1] = 1;
    kiln::Tensor h = kiln::max_pool2d(kiln::relu(kiln::conv2d(m.images, k1, c1, pad1)));  // [B, 8, 14, 14]
    h = kiln::max_pool2d(kiln::relu(kiln::conv2d(h, k2, c2, pad1)));                     // [B, 16, 7, 7]
    m.logits = kiln::matmul(h.reshape({B, 784}), w) + b;
  } else {
    kiln::fail("mnist", "unknown model '", kind, "' (use fc or cnn)");
  }
  m.logits.set_name("logits");
  return m;
}

void Model::init(uint64_t seed) {
  for (size_t i = 0; i < params.size(); ++i) {
    kiln::Tensor p = params[i];
    // fan_in: the inputs of one output unit. Weights [in, out] (dense) or
    // [O, C, KH, KW] (conv); a bias shares its layer's fan_in (the previous param).
    const kiln::Tensor w = p.ndim() == 1 ? params[i - 1] : p;
    const int64_t fan_in = w.ndim() == 4 ? w.size(1) * w.size(2) * w.size(3) : w.size(0);
    const float b = float(1.0 / std::sqrt(double(fan_in)));
    kiln::init_uniform(p, -b, b, seed * 1000 + i);
  }
}

}  // namespace mnist
