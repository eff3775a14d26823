// nanoGPT's model with kiln::nn: token and learned position embeddings, pre-LN
// transformer blocks, a final LayerNorm and an LM head tied to the token
// embedding. Parameter names follow nanoGPT (transformer.* dropped):
// wte.weight, wpe.weight, blocks.0.ln_1.weight, ..., ln_f.weight.
#pragma once
#include <cstdint>

#include "kiln/nn.h"

namespace gpt {

struct GptConfig {
  int64_t n_layer = 4, n_head = 4, n_embd = 128, block = 64, vocab = 256;
  float dropout = 0.0f;
  bool bias = true;
};

class Gpt : public kiln::nn::Module {
 public:
  Gpt(kiln::Context& ctx, const GptConfig& cfg);
  const char* type_name() const override { return "GPT"; }
  // idx i32 [B, T] (T <= block) -> logits f32 [B, T, vocab].
  kiln::Tensor forward(kiln::Tensor idx) override;
  // nanoGPT's init: every matrix N(0, 0.02), the residual projections
  // (attn.c_proj, mlp.c_proj) N(0, 0.02 / sqrt(2 n_layer)), biases 0, LayerNorm
  // weights 1. Params must have memory.
  void init_gpt(uint64_t seed);
  const GptConfig& config() const { return cfg_; }

  kiln::nn::Embedding& wte;
  kiln::nn::Embedding& wpe;
  kiln::nn::Dropout& drop;
  kiln::nn::Sequential& blocks;
  kiln::nn::LayerNorm& ln_f;
  kiln::nn::Linear& lm_head;

 private:
  GptConfig cfg_;
};

}  // namespace gpt
