#include "model.h"

namespace mnist {

namespace {

using kiln::Tensor;
namespace nn = kiln::nn;

struct Fc : nn::Module {
  nn::Linear& fc1;
  nn::Linear& fc2;
  explicit Fc(kiln::Context& ctx)
      : Module(ctx), fc1(add<nn::Linear>("fc1", 784, 500)), fc2(add<nn::Linear>("fc2", 500, 10)) {}
  Tensor forward(Tensor x) override { return fc2(kiln::relu(fc1(x))); }
};

kiln::Conv2dOptions pad1() {
  kiln::Conv2dOptions o;
  o.padding[0] = o.padding[1] = 1;
  return o;
}

struct Cnn : nn::Module {
  nn::Conv2d& conv1;
  nn::Conv2d& conv2;
  nn::Linear& dense;
  explicit Cnn(kiln::Context& ctx)
      : Module(ctx),
        conv1(add<nn::Conv2d>("conv1", 1, 8, 3, pad1())),
        conv2(add<nn::Conv2d>("conv2", 8, 16, 3, pad1())),
        dense(add<nn::Linear>("dense", 784, 10)) {}
  Tensor forward(Tensor x) override {
    Tensor h = kiln::max_pool2d(kiln::relu(conv1(x)));  // [B, 8, 14, 14]
    h = kiln::max_pool2d(kiln::relu(conv2(h)));         // [B, 16, 7, 7]
    return dense(h.reshape({x.size(0), 784}));
  }
};

}  // namespace

Model Model::build(const std::string& kind, int64_t B, kiln::DType precision) {
  Model m;
  m.kind = kind;
  kiln::Context& ctx = *m.ctx;
  ctx.set_matmul_precision(precision);
  if (kind == "fc") {
    m.net = std::make_unique<Fc>(ctx);
    m.images = ctx.input(kiln::f32, {B, 784}, "images");
  } else if (kind == "cnn") {
    m.net = std::make_unique<Cnn>(ctx);
    m.images = ctx.input(kiln::f32, {B, 1, 28, 28}, "images");
  } else {
    kiln::fail("mnist", "unknown model '", kind, "' (use fc or cnn)");
  }
  m.logits = (*m.net)(m.images).set_name("logits");
  return m;
}

}  // namespace mnist
