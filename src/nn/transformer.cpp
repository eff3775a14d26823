// Attention and the transformer block (nanoGPT's layout and names).
#include <cmath>

#include "kiln/nn.h"

namespace kiln::nn {

Tensor scaled_dot_product_attention(Tensor q, Tensor k, Tensor v, const SdpaOptions& opt) {
  if (!q.defined() || !k.defined() || !v.defined()) fail("attention", "q, k and v must be defined");
  if (q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4)
    fail("attention", "q, k, v must be [B, H, T, D], got ", q.shape().str(), ", ", k.shape().str(),
         ", ", v.shape().str());
  const float scale = opt.scale != 0.0f ? opt.scale : float(1.0 / std::sqrt(double(q.size(-1))));
  const bool drop = opt.training && opt.dropout > 0.0f;
  // The fused ATTENTION primitive (no [T, T] weights in memory), dropout on
  // the weights inside its kernels.
  if (!opt.composite) {
    kiln::AttentionOptions fused;
    fused.scale = scale;
    fused.causal = opt.causal;
    if (drop) {
      fused.dropout = opt.dropout;
      fused.seed = opt.seed;
      fused.seed_tensor = opt.seed_tensor;
    }
    return attention(q, k, v, fused);
  }
  // The composite, weights [B, H, T, T]; dropout draws the same mask.
  SoftmaxOptions so;
  so.scale = scale;
  so.causal = opt.causal;
  Tensor att = softmax(matmul(q, k.T()), so);
  if (drop) att = dropout(att, opt.dropout, opt.seed, true, opt.seed_tensor);
  return matmul(att, v);
}

CausalSelfAttention::CausalSelfAttention(Context& ctx, int64_t dim, int64_t n_head, float dropout,
                                         bool bias)
    : Module(ctx),
      c_attn(add<Linear>("c_attn", dim, 3 * dim, bias)),
      c_proj(add<Linear>("c_proj", dim, dim, bias)),
      resid_dropout(add<Dropout>("resid_dropout", dropout)),
      dim_(dim),
      n_head_(n_head),
      dropout_(dropout) {
  if (n_head <= 0 || dim % n_head != 0)
    fail("nn", "CausalSelfAttention: dim ", dim, " must be a positive multiple of n_head ", n_head);
}

Tensor CausalSelfAttention::forward(Tensor x) {
  if (x.ndim() != 3 || x.size(2) != dim_)
    fail("nn", "CausalSelfAttention '", path(), "' expects [B, T, ", dim_, "] but got ",
         x.shape().str());
  const int64_t B = x.size(0), T = x.size(1), H = n_head_, D = dim_ / n_head_;
  // c_attn's output [B, T, 3 dim] read as [B, T, 3H, D]: q, k and v are heads
  // [iH, (i+1)H) permuted to [B, H, T, D], strided views that attention reads in
  // place (nothing copied). Under the bf16 policy attention would cast each
  // head; the whole output is cast once instead, one contiguous conversion.
  Tensor qkv = c_attn(x).reshape({B, T, 3 * H, D});
  if (qkv.ctx().matmul_precision() == bf16 && qkv.dtype() == f32) qkv = qkv.to(bf16);
  auto head = [&](int i) { return qkv.narrow(2, i * H, H).permute({0, 2, 1, 3}); };
  SdpaOptions o;
  o.causal = true;
  o.dropout = dropout_;
  o.training = training();
  if (o.training && dropout_ > 0.0f) {
    o.seed = path_seed();
    o.seed_tensor = dropout_seed_tensor();
  }
  Tensor y = scaled_dot_product_attention(head(0), head(1), head(2), o);  // [B, H, T, D]
  y = y.permute({0, 2, 1, 3}).reshape({B, T, dim_});
  return resid_dropout(c_proj(y));
}

Mlp::Mlp(Context& ctx, int64_t dim, float p, bool bias)
    : Module(ctx),
      c_fc(add<Linear>("c_fc", dim, 4 * dim, bias)),
      c_proj(add<Linear>("c_proj", 4 * dim, dim, bias)),
      dropout(add<Dropout>("dropout", p)) {}

Tensor Mlp::forward(Tensor x) { return dropout(c_proj(gelu(c_fc(x)))); }

TransformerBlock::TransformerBlock(Context& ctx, int64_t dim, int64_t n_head, float dropout,
                                   bool bias)
    : Module(ctx),
      ln_1(add<LayerNorm>("ln_1", dim, 1e-5f, true, bias)),
      attn(add<CausalSelfAttention>("attn", dim, n_head, dropout, bias)),
      ln_2(add<LayerNorm>("ln_2", dim, 1e-5f, true, bias)),
      mlp(add<Mlp>("mlp", dim, dropout, bias)) {}

Tensor TransformerBlock::forward(Tensor x) {
  x = x + attn(ln_1(x));
  return x + mlp(ln_2(x));
}

}  // namespace kiln::nn
