// The basic layers: Linear, Conv2d, Embedding, LayerNorm, RMSNorm, Dropout,
// Flatten, Sequential. Default inits follow PyTorch's reset_parameters().
#include <cmath>

#include "kiln/ext/rng.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/nn.h"

namespace kiln::nn {

namespace {

void check_positive(const char* layer, const char* what, int64_t v) {
  if (v <= 0) fail("nn", layer, ": ", what, " must be positive, got ", v);
}

// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): what PyTorch's kaiming_uniform_(a=sqrt(5))
// gives a weight, and the bound it uses for the bias.
void init_fan_in(Tensor t, int64_t fan_in, uint64_t seed) {
  const float b = float(1.0 / std::sqrt(double(fan_in)));
  init_uniform(t, -b, b, seed);
}

uint64_t sub_seed(uint64_t seed, uint64_t i) { return detail::splitmix64(seed + i); }

}  // namespace

// ---- Linear ----
LinearBase::LinearBase(Context& ctx, int64_t in, int64_t out, bool bias, bool fan_in_fan_out)
    : Module(ctx), in_(in), out_(out), has_bias_(bias), fan_in_fan_out_(fan_in_fan_out) {
  check_positive("Linear", "in_features", in);
  check_positive("Linear", "out_features", out);
  if (fan_in_fan_out) register_parameter("weight", {in, out});
  else register_parameter("weight", {out, in});
  if (bias) register_parameter("bias", {out});
}

Tensor LinearBase::forward(Tensor x) {
  if (x.ndim() < 1 || x.size(-1) != in_)
    fail("nn", type_name(), " '", path(), "' expects inputs [..., ", in_, "] but got ",
         x.shape().str());
  // One GEMM over all leading dims: [..., in] -> [N, in] (a view when contiguous).
  Shape lead = x.shape();
  Tensor x2 = x.ndim() == 2 ? x : x.reshape({x.numel() / in_, in_});
  Tensor y = matmul(x2, fan_in_fan_out_ ? weight() : weight().T());  // W^T is read in place
  if (has_bias_) y = y + bias();
  if (const Lora* a = merged_ ? nullptr : find_lora(active_)) {
    // LoRA: x A^T B^T, scaled; the rank-r product is never formed as a matrix.
    Tensor h = matmul((*a->drop)(x2), a->A->weight().T());
    y = y + matmul(h, a->B->weight().T()) * a->scaling;
  }
  if (x.ndim() != 2) {
    Shape s;
    for (int d = 0; d + 1 < lead.ndim(); ++d) s.push_back(lead[d]);
    s.push_back(out_);
    y = y.reshape(s);
  }
  return y;
}

Linear::Linear(Context& ctx, int64_t in, int64_t out, bool bias)
    : LinearBase(ctx, in, out, bias, false) {}

void Linear::reset_parameters(uint64_t seed) {
  init_fan_in(weight(), in_features(), sub_seed(seed, 0));
  if (bias().defined()) init_fan_in(bias(), in_features(), sub_seed(seed, 1));
}

// ---- Conv2d ----
Conv2d::Conv2d(Context& ctx, int64_t in, int64_t out, int64_t k, Conv2dOptions opt, bool bias)
    : Module(ctx), opt_(opt), has_bias_(bias) {
  check_positive("Conv2d", "in_channels", in);
  check_positive("Conv2d", "out_channels", out);
  check_positive("Conv2d", "kernel_size", k);
  register_parameter("weight", {out, in, k, k});
  if (bias) register_parameter("bias", {out});
}

Tensor Conv2d::forward(Tensor x) { return conv2d(x, weight(), bias(), opt_); }

void Conv2d::reset_parameters(uint64_t seed) {
  const Shape& s = weight().shape();
  const int64_t fan_in = s[1] * s[2] * s[3];
  init_fan_in(weight(), fan_in, sub_seed(seed, 0));
  if (has_bias_) init_fan_in(bias(), fan_in, sub_seed(seed, 1));
}

// ---- Embedding ----
Embedding::Embedding(Context& ctx, int64_t num, int64_t dim) : Module(ctx) {
  check_positive("Embedding", "num_embeddings", num);
  check_positive("Embedding", "embedding_dim", dim);
  register_parameter("weight", {num, dim});
}

Tensor Embedding::forward(Tensor indices) { return embedding(weight(), indices); }

void Embedding::reset_parameters(uint64_t seed) {
  init_normal(weight(), 0.0f, 1.0f, sub_seed(seed, 0));
}

// ---- norms ----
LayerNorm::LayerNorm(Context& ctx, int64_t dim, float eps, bool affine, bool bias)
    : Module(ctx), eps_(eps), affine_(affine), has_bias_(affine && bias) {
  check_positive("LayerNorm", "dim", dim);
  if (affine_) register_parameter("weight", {dim});
  if (has_bias_) register_parameter("bias", {dim});
}

Tensor LayerNorm::forward(Tensor x) { return layer_norm(x, weight(), bias(), eps_); }

void LayerNorm::reset_parameters(uint64_t) {
  if (affine_) init_uniform(weight(), 1.0f, 1.0f, 0);
  if (has_bias_) bias().fill_zero();
}

RMSNorm::RMSNorm(Context& ctx, int64_t dim, float eps, bool affine)
    : Module(ctx), eps_(eps), affine_(affine) {
  check_positive("RMSNorm", "dim", dim);
  if (affine_) register_parameter("weight", {dim});
}

Tensor RMSNorm::forward(Tensor x) { return rms_norm(x, weight(), eps_); }

void RMSNorm::reset_parameters(uint64_t) {
  if (affine_) init_uniform(weight(), 1.0f, 1.0f, 0);
}

// ---- Dropout ----
Dropout::Dropout(Context& ctx, float p) : Module(ctx), p_(p) {
  if (!(p >= 0.0f && p < 1.0f)) fail("nn", "Dropout: p must be in [0, 1), got ", p);
}

Tensor Dropout::forward(Tensor x) {
  if (!training() || p_ == 0.0f) return x;
  return dropout(x, p_, path_seed(), true, dropout_seed_tensor());
}

// ---- Flatten ----
Tensor Flatten::forward(Tensor x) {
  if (x.ndim() < 2) return x;
  return x.reshape({x.size(0), x.numel() / x.size(0)});
}

// ---- Sequential ----
Module& Sequential::push_back(std::unique_ptr<Module> m) {
  return register_module(std::to_string(size()), std::move(m));
}

size_t Sequential::size() const { return child_count(); }

Module& Sequential::operator[](size_t i) const {
  if (i >= child_count())
    fail("nn", "Sequential '", path(), "' has ", child_count(), " modules, no index ", i);
  return child_at(i);
}

Tensor Sequential::forward(Tensor x) {
  for (size_t i = 0; i < child_count(); ++i) x = child_at(i)(x);
  return x;
}

}  // namespace kiln::nn
