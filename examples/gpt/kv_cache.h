// Generation with a KV cache: one graph that advances the model by a single
// token, attending to the keys and values of the earlier positions kept in
// per-layer cache tensors, so each new token costs O(context) instead of a
// forward pass over the whole context.
//
//   KvDecoder dec(model, cpu);          // the model's weights, not copied
//   const float* logits = dec.prefill(prompt);  // positions 0..n-1 in one pass
//   logits = dec.step(token);                   // position n, n+1, ...
//
// The step graph is built once: the new token's q, k, v come from the layer's
// c_attn; its scores against the cache (masked beyond the current length) and
// against its own key go through one softmax; after the graph runs, the new
// key and value rows are copied into the cache. Same weights and the same
// arithmetic as Gpt::forward, so the logits agree with recomputing the full
// context (ctest gpt_train_resume_eval_sample runs `sample --check-cache`).
// prefill() fills the cache from a whole context with a second graph over the
// block (fused causal attention, like Gpt::forward): one batched pass instead
// of one step per token when the sampler starts or cuts its context.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gpt_model.h"
#include "kiln/kiln.h"

namespace gpt {

class KvDecoder {
 public:
  KvDecoder(Gpt& model, kiln::Backend& backend);
  // Feeds `token` at the next position and returns the logits [vocab] for the
  // token after it (valid until the next call). Throws kiln::Error when the
  // block is full (position == block): reset() and feed a shorter context.
  const float* step(int32_t token);
  // reset(), then the cache holds `tokens` (1..block of them) at positions
  // 0..n-1; returns the logits after the last one (valid until the next call).
  const float* prefill(const std::vector<int32_t>& tokens);
  void reset();
  int64_t position() const { return pos_; }

 private:
  Gpt& model_;
  kiln::Backend& backend_;
  kiln::Context& ctx_;
  int64_t block_, heads_, head_dim_;
  kiln::Tensor tok_, pos_in_, mask_, logits_;
  std::vector<kiln::Tensor> k_cache_, v_cache_, k_new_, v_new_;
  // prefill graph: the block's tokens, each layer's k and v [1, H, block, D]
  kiln::Tensor pre_idx_, pre_logits_;
  std::vector<kiln::Tensor> pre_k_, pre_v_;
  std::unique_ptr<kiln::Buffer> buf_;
  kiln::Graph graph_, pre_graph_;
  std::vector<float> mask_host_, out_;
  int64_t pos_ = 0;
};

}  // namespace gpt
