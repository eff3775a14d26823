// Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): a router Linear picks
// each token's top-k experts, each a SwiGLU MLP, and their outputs are summed
// weighted by the routing probabilities. The experts' weights are stacked
// [E, ...] tensors multiplied through kiln::expert_matmul, so a token reads
// only its experts' weights.
//
//   kiln::nn::MoeOptions o{/*hidden=*/64, /*intermediate=*/128, /*experts=*/8, /*top_k=*/2};
//   kiln::nn::MoeFeedForward& moe = model.add<kiln::nn::MoeFeedForward>("mlp", o);
//   kiln::Tensor y = moe(x);  // [..., 64] -> [..., 64]
#pragma once
#include <cstdint>

#include "kiln/nn.h"

namespace kiln::nn {

// Each token's experts and their weights from router logits [N, E] (f32):
// p = softmax over all E experts, ids = the k largest (kiln::topk_indices:
// largest first, ties by lower index), weights = p at ids, divided by their
// sum when norm_topk_prob. Mixtral always normalises (equal to a softmax over
// the k chosen logits); Qwen3-MoE and OLMoE follow the config's
// norm_topk_prob. Gradients reach the logits through the weights (ids have
// none).
struct MoeRouting {
  Tensor weights;  // f32 [N, k]
  Tensor ids;      // i32 [N, k]
};
MoeRouting moe_route(Tensor logits, int64_t top_k, bool norm_topk_prob);

struct MoeOptions {
  int64_t hidden = 0;        // model width H
  int64_t intermediate = 0;  // each expert's hidden width I (moe_intermediate_size)
  int64_t num_experts = 0;   // E
  int64_t top_k = 0;         // experts per token (num_experts_per_tok)
  bool norm_topk_prob = true;
};

// Params: gate.weight [E, H] (the router, no bias), gate_exps [E, I, H],
// up_exps [E, I, H], down_exps [E, H, I] (GGUF's ffn_{gate,up,down}_exps
// layout; Hugging Face's per-expert gate_proj / up_proj / down_proj weights
// are rows of them). Expert e computes down_e(silu(gate_e x) * up_e x).
// Default init: every weight U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as Linear's.
class MoeFeedForward : public Module {
 public:
  MoeFeedForward(Context& ctx, const MoeOptions& o);
  const char* type_name() const override { return "MoeFeedForward"; }
  Tensor forward(Tensor x) override;  // [..., H] -> [..., H]
  void reset_parameters(uint64_t seed) override;
  const MoeOptions& options() const { return o_; }
  Linear& gate;
  Tensor gate_exps() const { return own(0); }
  Tensor up_exps() const { return own(1); }
  Tensor down_exps() const { return own(2); }

 private:
  MoeOptions o_;
};

}  // namespace kiln::nn
