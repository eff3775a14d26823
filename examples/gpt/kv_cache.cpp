#include "kv_cache.h"

#include <cmath>
#include <limits>

namespace gpt {

using kiln::Tensor;

KvDecoder::KvDecoder(Gpt& model, kiln::Backend& backend)
    : model_(model), backend_(backend), ctx_(model.ctx()) {
  const GptConfig& c = model.config();
  block_ = c.block, heads_ = c.n_head, head_dim_ = c.n_embd / c.n_head;
  const int64_t C = c.n_embd, H = heads_, D = head_dim_;
  const float scale = 1.0f / std::sqrt(float(D));
  tok_ = ctx_.input(kiln::i32, {1, 1}, "kv.token");
  pos_in_ = ctx_.input(kiln::i32, {1}, "kv.position");
  mask_ = ctx_.input(kiln::f32, {1, block_}, "kv.mask");  // 0 for cached positions, -inf beyond
  Tensor x = model.wte(tok_) + kiln::embedding(model.wpe.weight(), pos_in_);  // [1, 1, C]
  for (size_t l = 0; l < model.blocks.size(); ++l) {
    auto& blk = static_cast<kiln::nn::TransformerBlock&>(model.blocks[l]);
    Tensor kc = ctx_.input(kiln::f32, {1, H, block_, D}),
           vc = ctx_.input(kiln::f32, {1, H, block_, D});
    Tensor qkv = blk.attn.c_attn(blk.ln_1(x));  // [1, 1, 3C]
    auto head = [&](int i) {
      return qkv.narrow(2, i * C, C).reshape({1, 1, H, D}).permute({0, 2, 1, 3});
    };
    Tensor q = head(0), k = head(1).contiguous(), v = head(2).contiguous();  // [1, H, 1, D]
    Tensor s_cache = kiln::matmul(q, kc.T()) * scale + mask_;                // [1, H, 1, block]
    Tensor s_self = kiln::matmul(q, k.T()) * scale;                          // [1, H, 1, 1]
    Tensor p = kiln::softmax(kiln::concat({s_cache, s_self}, 3));
    Tensor y =
        kiln::matmul(p.narrow(3, 0, block_), vc) + p.narrow(3, block_, 1) * v;  // [1, H, 1, D]
    y = blk.attn.c_proj(y.permute({0, 2, 1, 3}).reshape({1, 1, C}));
    x = x + y;
    x = x + blk.mlp(blk.ln_2(x));
    k_cache_.push_back(kc), v_cache_.push_back(vc), k_new_.push_back(k), v_new_.push_back(v);
  }
  logits_ = model.lm_head(model.ln_f(x));  // [1, 1, vocab]

  // The prefill graph: Gpt::forward over the block, keeping each layer's k, v.
  pre_idx_ = ctx_.input(kiln::i32, {1, block_}, "kv.prefill_tokens");
  Tensor h = model.wte(pre_idx_) + model.wpe.weight().narrow(0, 0, block_);  // [1, block, C]
  for (size_t l = 0; l < model.blocks.size(); ++l) {
    auto& blk = static_cast<kiln::nn::TransformerBlock&>(model.blocks[l]);
    Tensor qkv = blk.attn.c_attn(blk.ln_1(h));  // [1, block, 3C]
    auto head = [&](int i) {
      return qkv.narrow(2, i * C, C).reshape({1, block_, H, D}).permute({0, 2, 1, 3});
    };
    Tensor k = head(1).contiguous(), v = head(2).contiguous();  // [1, H, block, D]
    kiln::AttentionOptions causal;
    causal.causal = true;
    Tensor y = kiln::attention(head(0), k, v, causal);
    h = h + blk.attn.c_proj(y.permute({0, 2, 1, 3}).reshape({1, block_, C}));
    h = h + blk.mlp(blk.ln_2(h));
    pre_k_.push_back(k), pre_v_.push_back(v);
  }
  pre_logits_ = model.lm_head(model.ln_f(h));  // [1, block, vocab]
  // The new tensors only, each its own memory (k, v of the prefill stay readable
  // after it runs); the weights stay where they are.
  buf_ = kiln::allocate_tensors(ctx_, backend_);
  graph_ = kiln::Graph::forward(logits_);
  pre_graph_ = kiln::Graph::forward(pre_logits_);
  reset();
}

void KvDecoder::reset() {
  pos_ = 0;
  mask_host_.assign(size_t(block_), -std::numeric_limits<float>::infinity());
  for (Tensor t : k_cache_) t.fill_zero();
  for (Tensor t : v_cache_) t.fill_zero();
}

const float* KvDecoder::prefill(const std::vector<int32_t>& tokens) {
  const int64_t n = int64_t(tokens.size());
  if (n < 1 || n > block_)
    kiln::fail("gpt", "KV-cache prefill of ", n, " tokens: need 1..", block_);
  reset();
  std::vector<int32_t> window(size_t(block_), 0);  // after n: ignored (causal)
  std::copy(tokens.begin(), tokens.end(), window.begin());
  pre_idx_.set<int32_t>(window);
  backend_.compute(pre_graph_);
  for (size_t l = 0; l < k_cache_.size(); ++l) {
    k_cache_[l].narrow(2, 0, n).set<float>(pre_k_[l].narrow(2, 0, n).get<float>());
    v_cache_[l].narrow(2, 0, n).set<float>(pre_v_[l].narrow(2, 0, n).get<float>());
  }
  std::fill(mask_host_.begin(), mask_host_.begin() + n, 0.0f);
  pos_ = n;
  out_ = pre_logits_.narrow(1, n - 1, 1).get<float>();
  return out_.data();
}

const float* KvDecoder::step(int32_t token) {
  if (pos_ >= block_)
    kiln::fail("gpt", "KV cache full at ", block_,
               " positions: reset() and feed a shorter context");
  tok_.set<int32_t>({token});
  pos_in_.set<int32_t>({int32_t(pos_)});
  mask_.set<float>(mask_host_);
  backend_.compute(graph_);
  for (size_t l = 0; l < k_cache_.size(); ++l) {
    k_cache_[l].narrow(2, pos_, 1).set<float>(k_new_[l].get<float>());
    v_cache_[l].narrow(2, pos_, 1).set<float>(v_new_[l].get<float>());
  }
  mask_host_[size_t(pos_)] = 0.0f;  // the next steps attend to this position too
  ++pos_;
  out_ = logits_.get<float>();
  return out_.data();
}

}  // namespace gpt
