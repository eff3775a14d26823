#include "gpt_model.h"

#include <cmath>
#include <string>

#include "kiln/error.h"
#include "kiln/nn/init.h"

namespace gpt {

using kiln::Tensor;
namespace nn = kiln::nn;

Gpt::Gpt(kiln::Context& ctx, const GptConfig& cfg)
    : Module(ctx),
      wte(add<nn::Embedding>("wte", cfg.vocab, cfg.n_embd)),
      wpe(add<nn::Embedding>("wpe", cfg.block, cfg.n_embd)),
      drop(add<nn::Dropout>("drop", cfg.dropout)),
      blocks(add<nn::Sequential>("blocks")),
      ln_f(add<nn::LayerNorm>("ln_f", cfg.n_embd, 1e-5f, true, cfg.bias)),
      lm_head(add<nn::Linear>("lm_head", cfg.n_embd, cfg.vocab, false)),
      cfg_(cfg) {
  if (cfg.n_layer < 1 || cfg.n_head < 1 || cfg.n_embd % cfg.n_head != 0 || cfg.block < 1)
    kiln::fail("gpt", "bad configuration: n_layer ", cfg.n_layer, ", n_head ", cfg.n_head,
               ", n_embd ", cfg.n_embd, " (a multiple of n_head), block ", cfg.block);
  for (int64_t i = 0; i < cfg.n_layer; ++i)
    blocks.push_back<nn::TransformerBlock>(cfg.n_embd, cfg.n_head, cfg.dropout, cfg.bias);
  lm_head.tie("weight", wte.weight());  // one tensor, its gradient summed over both uses
}

Tensor Gpt::forward(Tensor idx) {
  if (idx.ndim() != 2 || idx.shape()[1] > cfg_.block)
    kiln::fail("gpt", "input must be i32 [B, T] with T <= block ", cfg_.block, ", got ",
               idx.shape().str());
  const int64_t t = idx.shape()[1];
  // Positions 0..T-1 are the first T rows of wpe: a view, no index input needed.
  Tensor x = wte(idx) + wpe.weight().narrow(0, 0, t);
  x = drop(x);
  x = blocks(x);
  return lm_head(ln_f(x));
}

namespace {
bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}
}  // namespace

void Gpt::init_gpt(uint64_t seed) {
  init(seed);  // LayerNorm weights 1 and biases 0, the rest replaced below
  const float residual_std = 0.02f / std::sqrt(2.0f * float(cfg_.n_layer));
  uint64_t i = 0;
  for (auto& [name, t] : named_parameters()) {
    ++i;
    if (t.ndim() < 2) {
      if (ends_with(name, ".bias")) t.fill_zero();
      continue;
    }
    const bool residual =
        ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight");
    kiln::init_normal(t, 0.0f, residual ? residual_std : 0.02f, seed * 1000003 + i);
  }
}

}  // namespace gpt
