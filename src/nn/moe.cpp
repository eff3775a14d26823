// The mixture-of-experts feed-forward block and its top-k routing (kiln/nn/moe.h).
#include "kiln/nn/moe.h"

#include <cmath>

#include "kiln/ext/rng.h"

namespace kiln::nn {

MoeRouting moe_route(Tensor logits, int64_t top_k, bool norm_topk_prob) {
  if (!logits.defined() || logits.ndim() != 2)
    fail("moe_route", "router logits must be [N, E], got ",
         logits.defined() ? logits.shape().str() : std::string("an undefined tensor"));
  if (top_k < 1 || top_k > logits.size(1))
    fail("moe_route", "top_k = ", top_k, " but there are ", logits.size(1), " experts");
  MoeRouting r;
  r.ids = topk_indices(logits, top_k);  // softmax keeps the order
  r.weights = gather_last(softmax(logits), r.ids);
  if (norm_topk_prob) r.weights = r.weights / sum(r.weights, -1, true);
  return r;
}

MoeFeedForward::MoeFeedForward(Context& ctx, const MoeOptions& o)
    : Module(ctx), gate(add<Linear>("gate", o.hidden, o.num_experts, false)), o_(o) {
  if (o.intermediate <= 0 || o.top_k <= 0 || o.top_k > o.num_experts)
    fail("nn", "MoeFeedForward: intermediate ", o.intermediate, " must be positive and top_k ",
         o.top_k, " in [1, num_experts = ", o.num_experts, "]");
  register_parameter("gate_exps", {o.num_experts, o.intermediate, o.hidden});
  register_parameter("up_exps", {o.num_experts, o.intermediate, o.hidden});
  register_parameter("down_exps", {o.num_experts, o.hidden, o.intermediate});
}

void MoeFeedForward::reset_parameters(uint64_t seed) {
  const float bh = float(1.0 / std::sqrt(double(o_.hidden)));
  const float bi = float(1.0 / std::sqrt(double(o_.intermediate)));
  init_uniform(gate_exps(), -bh, bh, detail::splitmix64(seed + 0));
  init_uniform(up_exps(), -bh, bh, detail::splitmix64(seed + 1));
  init_uniform(down_exps(), -bi, bi, detail::splitmix64(seed + 2));
}

Tensor MoeFeedForward::forward(Tensor x) {
  const int64_t H = o_.hidden;
  if (!x.defined() || x.ndim() < 1 || x.size(-1) != H)
    fail("nn", "MoeFeedForward '", path(), "' expects inputs [..., ", H, "] but got ",
         x.defined() ? x.shape().str() : std::string("an undefined tensor"));
  const int64_t N = x.numel() / H, k = o_.top_k;
  const Tensor x2 = x.ndim() == 2 ? x : x.reshape({N, H});
  const MoeRouting r = moe_route(gate(x2), k, o_.norm_topk_prob);
  // Each token's k experts: [N, k, I], then down to [N, k, H], weighted, summed.
  const Tensor h =
      silu(expert_matmul(x2, gate_exps(), r.ids)) * expert_matmul(x2, up_exps(), r.ids);
  const Tensor y = sum(expert_matmul(h, down_exps(), r.ids) * r.weights.reshape({N, k, 1}), 1);
  return x.ndim() == 2 ? y : y.reshape(x.shape());
}

}  // namespace kiln::nn
