// The models the CUDA backend must run entirely on the GPU: MNIST fc and cnn
// from examples/mnist/model.h, a GPT-style transformer block built from basic
// ops (embeddings, layer norm, causal multi-head attention, GELU MLP, tied
// logits, cross-entropy) and kiln-gpt's model (the fused ops), f32 and bf16. Each owns its Context
// and is trained through an OptContext with AdamW, so its graph holds the forward, backward and
// optimizer-step nodes.
#pragma once
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gpt_model.h"  // examples/gpt
#include "kiln/kiln.h"
#include "kiln/opt.h"
#include "model.h"  // examples/mnist

namespace kiln::test {

struct TestModel {
  std::string name;
  std::unique_ptr<Context> ctx = std::make_unique<Context>();
  std::unique_ptr<nn::Module> net;       // the MNIST models' (destroyed before ctx)
  Tensor inputs, outputs, labels, loss;  // loss: LossKind::user models only
  std::vector<Tensor> params, extra_inputs;

  OptConfig config(std::vector<Backend*> backends) const {
    OptConfig c;
    c.inputs = inputs;
    c.outputs = outputs;
    if (loss.defined()) {
      c.loss = LossKind::user;
      c.user_loss = loss;
    }
    c.params = params;
    c.backends = std::move(backends);
    return c;
  }
  Tensor param(const Shape& s, const std::string& n) {
    Tensor t = ctx->param(f32, s, n);
    params.push_back(t);
    return t;
  }
  // Deterministic values for every param and input (by name and seed).
  void fill(OptContext& opt, uint64_t seed) const {
    std::mt19937_64 rng(seed);
    auto uni = [&](double lo, double hi) {
      return lo + (hi - lo) * double(rng() >> 11) * (1.0 / 9007199254740992.0);
    };
    for (const Tensor& p : params) {
      std::vector<float> v(size_t(p.numel()));
      const double b =
          1.0 / std::sqrt(double(p.numel() / p.size(0) > 0 ? p.numel() / p.size(0) : 1));
      for (float& x : v) x = float(uni(-b, b));
      Tensor(p).set(v);
    }
    std::vector<Tensor> ins = extra_inputs;
    ins.push_back(inputs);
    if (!loss.defined()) ins.push_back(opt.labels());
    for (const Tensor& t : ins) {
      if (t.dtype() == i32) {
        // Class ids / tokens / positions below the size of the dim they index.
        const int64_t limit = t.name() == "pos" ? t.numel() : 10;
        std::vector<int32_t> v(size_t(t.numel()));
        for (size_t i = 0; i < v.size(); ++i)
          v[i] = t.name() == "pos" ? int32_t(i) : int32_t(rng() % uint64_t(limit));
        Tensor(t).set(v);
      } else {
        std::vector<float> v(size_t(t.numel()));
        for (float& x : v) x = float(uni(0.0, 1.0));
        Tensor(t).set(v);
      }
    }
  }
};

// kiln-mnist's models as examples/mnist/model.h defines them (the one MNIST
// definition of the example, the benchmarks and these tests).
inline std::unique_ptr<TestModel> mnist_model(const std::string& kind, int64_t B) {
  auto m = std::make_unique<TestModel>();
  mnist::Model built = mnist::Model::build(kind, B);
  m->name = "mnist_" + kind;
  m->ctx = std::move(built.ctx);
  m->net = std::move(built.net);
  m->inputs = built.images;
  m->outputs = built.logits;
  m->params = m->net->parameters();
  return m;
}
inline std::unique_ptr<TestModel> mnist_fc(int64_t B = 8) { return mnist_model("fc", B); }
inline std::unique_ptr<TestModel> mnist_cnn(int64_t B = 4) { return mnist_model("cnn", B); }

// One pre-norm transformer block; vocabulary V, context T, width D, H heads.
inline std::unique_ptr<TestModel> gpt_block(int64_t B = 2, int64_t T = 8, int64_t D = 16,
                                            int64_t H = 2, int64_t V = 10) {
  auto m = std::make_unique<TestModel>();
  m->name = "gpt_block";
  Context& ctx = *m->ctx;
  const int64_t Dh = D / H;
  m->inputs = ctx.input(i32, {B, T}, "tokens");
  Tensor pos = ctx.input(i32, {T}, "pos");
  Tensor targets = ctx.input(i32, {B * T}, "targets");
  m->extra_inputs = {pos, targets};
  Tensor wte = m->param({V, D}, "wte"), wpe = m->param({T, D}, "wpe");
  Tensor ln1w = m->param({D}, "ln1.weight"), ln1b = m->param({D}, "ln1.bias");
  Tensor wqkv = m->param({D, 3 * D}, "attn.qkv"), wo = m->param({D, D}, "attn.proj");
  Tensor ln2w = m->param({D}, "ln2.weight"), ln2b = m->param({D}, "ln2.bias");
  Tensor w_up = m->param({D, 4 * D}, "mlp.up"), b_up = m->param({4 * D}, "mlp.up.bias");
  Tensor w_down = m->param({4 * D, D}, "mlp.down");
  Tensor lnfw = m->param({D}, "lnf.weight");

  Tensor x = embedding(wte, m->inputs) + embedding(wpe, pos);  // [B, T, D]
  Tensor qkv = matmul(layer_norm(x, ln1w, ln1b), wqkv);        // [B, T, 3D]
  auto heads = [&](int k) {
    return qkv.narrow(2, k * D, D).reshape({B, T, H, Dh}).permute({0, 2, 1, 3});  // [B, H, T, Dh]
  };
  Tensor q = heads(0), k = heads(1), v = heads(2);
  SoftmaxOptions so;
  so.scale = float(1.0 / std::sqrt(double(Dh)));
  so.causal = true;
  Tensor att = softmax(matmul(q, k.transpose(-2, -1)), so);            // [B, H, T, T]
  Tensor y = matmul(att, v).permute({0, 2, 1, 3}).reshape({B, T, D});  // [B, T, D]
  x = x + matmul(y, wo);
  x = x + matmul(gelu(matmul(layer_norm(x, ln2w, ln2b), w_up) + b_up), w_down);
  Tensor logits = matmul(layer_norm(x, lnfw), wte.T());  // tied embedding
  m->outputs = logits.reshape({B * T, V});
  m->loss = cross_entropy(m->outputs, targets);
  return m;
}

// kiln-gpt's model (examples/gpt/gpt_model.h: the fused layer norm and
// attention, the fused cross-entropy as its loss), small, at a matmul precision
// (bf16: casts, bf16 products and attention inputs). No dropout by default, so
// two backends compute the same function.
inline std::unique_ptr<TestModel> kiln_gpt(DType precision, int64_t B = 2, float dropout = 0) {
  auto m = std::make_unique<TestModel>();
  m->name = std::string("kiln_gpt_") + dtype_name(precision);
  Context& ctx = *m->ctx;
  ctx.set_matmul_precision(precision);
  gpt::GptConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 32;
  c.block = 16;
  c.vocab = 48;
  c.dropout = dropout;
  auto net = std::make_unique<gpt::Gpt>(ctx, c);
  m->inputs = ctx.input(i32, {B, c.block}, "tokens");
  Tensor targets = ctx.input(i32, {B * c.block}, "targets");
  m->extra_inputs = {targets};
  m->outputs = (*net)(m->inputs).reshape({B * c.block, c.vocab});
  m->loss = cross_entropy(m->outputs, targets);
  m->params = net->parameters();
  m->net = std::move(net);
  return m;
}

inline std::vector<std::unique_ptr<TestModel>> all_test_models() {
  std::vector<std::unique_ptr<TestModel>> v;
  v.push_back(mnist_fc());
  v.push_back(mnist_cnn());
  v.push_back(gpt_block());
  return v;
}

}  // namespace kiln::test
