// The Llama family (LlamaForCausalLM's layout and parameter names): RMSNorm,
// RoPE, grouped-query attention, SwiGLU; Qwen2's q/k/v biases, Qwen3's q/k
// norms, Mistral's sliding window, and Phi-3's fused projections and partial
// rotary are switches of the config.
#include <cmath>
#include <memory>

#include "kiln/models.h"
#include "models/kv_attention.h"
#include "models/rope.h"
#include "models/weight_quant.h"

namespace kiln::models {
namespace {

// What every layer reads: the config and the model's constant tables.
struct LlamaShared {
  LlamaConfig cfg;
  Tensor cos, sin;   // [S, head_dim]
  Tensor positions;  // [S] 0, 1, ... (for the sliding-window mask)
  int64_t max_seq = 0;
  // Packed examples, set while forward_packed builds its graph (undefined
  // otherwise): segment ids [B, T] and the RoPE rows of each token's own
  // position [B, T, head_dim].
  struct Packing {
    Tensor segments, cos, sin;
  };
  mutable Packing packing;
};

class LlamaAttention : public nn::Module {
 public:
  LlamaAttention(Context& ctx, std::shared_ptr<const LlamaShared> s)
      : Module(ctx), s_(std::move(s)) {
    const LlamaConfig& c = s_->cfg;
    const int64_t q_out = c.num_attention_heads * c.head_dim,
                  kv_out = c.num_key_value_heads * c.head_dim;
    if (c.fused_projections) {
      qkv_proj = &add<nn::Linear>("qkv_proj", c.hidden_size, q_out + 2 * kv_out, c.qkv_bias);
    } else {
      q_proj = &add<nn::Linear>("q_proj", c.hidden_size, q_out, c.qkv_bias);
      k_proj = &add<nn::Linear>("k_proj", c.hidden_size, kv_out, c.qkv_bias);
      v_proj = &add<nn::Linear>("v_proj", c.hidden_size, kv_out, c.qkv_bias);
    }
    o_proj = &add<nn::Linear>("o_proj", q_out, c.hidden_size, c.o_bias);
    if (s_->cfg.qk_norm) {
      q_norm = &add<nn::RMSNorm>("q_norm", s_->cfg.head_dim, float(s_->cfg.rms_norm_eps));
      k_norm = &add<nn::RMSNorm>("k_norm", s_->cfg.head_dim, float(s_->cfg.rms_norm_eps));
    }
  }
  const char* type_name() const override { return "LlamaAttention"; }

  Tensor forward(Tensor x) override {
    const LlamaConfig& c = s_->cfg;
    const int64_t B = x.size(0), T = x.size(1), H = c.num_attention_heads,
                  Hkv = c.num_key_value_heads, D = c.head_dim;
    auto [q, k, v] = project(x);
    q = q.reshape({B, T, H, D});
    k = k.reshape({B, T, Hkv, D});
    v = v.reshape({B, T, Hkv, D});
    if (q_norm) {
      q = (*q_norm)(q);
      k = (*k_norm)(k);
    }
    const LlamaShared::Packing& pk = s_->packing;
    if (pk.segments.defined()) {  // positions restart per packed example
      q = detail::rotate(q, pk.cos, pk.sin);
      k = detail::rotate(k, pk.cos, pk.sin);
    } else {
      q = detail::apply_rope(q, s_->cos, s_->sin);
      k = detail::apply_rope(k, s_->cos, s_->sin);
    }
    if (B == 1) {
      // Query head h = j * G + g reads key/value head j: q as [Hkv, G, T, D]
      // against k and v as [Hkv, 1, T, D], broadcast over G (views: nothing is
      // copied per head). Tensors have at most 4 dims, so batches of several
      // sequences repeat k and v per query head instead.
      auto grouped = [&](Tensor t, int64_t g) {
        return t.reshape({T, Hkv, g, D}).permute({1, 2, 0, 3});
      };
      Tensor y = attend(grouped(q, H / Hkv), grouped(k, 1), grouped(v, 1), T);  // [Hkv, G, T, D]
      return (*o_proj)(y.permute({2, 0, 1, 3}).reshape({1, T, H * D}));
    }
    Tensor y =
        attend(q.permute({0, 2, 1, 3}), repeat_kv(k, H), repeat_kv(v, H), T);  // [B, H, T, D]
    return (*o_proj)(y.permute({0, 2, 1, 3}).reshape({B, T, H * D}));
  }

  // The new tokens x [1, T, hidden] of a KvStep, cos/sin their RoPE rows [T, D];
  // appends this layer's new keys and values to step.k_new / v_new.
  Tensor forward_cached(Tensor x, KvStep& step, size_t layer, Tensor cos, Tensor sin) {
    const LlamaConfig& c = s_->cfg;
    const int64_t T = x.size(1), H = c.num_attention_heads, Hkv = c.num_key_value_heads,
                  D = c.head_dim;
    auto [q, k, v] = project(x);
    q = q.reshape({1, T, H, D});
    k = k.reshape({1, T, Hkv, D});
    v = v.reshape({T, Hkv, D});
    if (q_norm) {
      q = (*q_norm)(q);
      k = (*k_norm)(k);
    }
    q = detail::apply_rope(q, cos, sin).reshape({T, H, D});
    k = detail::apply_rope(k, cos, sin).reshape({T, Hkv, D});
    step.k_new.push_back(k);
    step.v_new.push_back(v);
    const float scale = float(1.0 / std::sqrt(double(D)));
    return (*o_proj)(detail::cached_attention(q, k, v, step, layer, scale));
  }

  // q_proj, k_proj, v_proj; or Phi-3's qkv_proj (fused_projections).
  nn::Linear* q_proj = nullptr;
  nn::Linear* k_proj = nullptr;
  nn::Linear* v_proj = nullptr;
  nn::Linear* qkv_proj = nullptr;
  nn::Linear* o_proj = nullptr;
  nn::RMSNorm* q_norm = nullptr;
  nn::RMSNorm* k_norm = nullptr;

 private:
  struct Qkv {
    Tensor q, k, v;
  };
  // q, k, v [.., T, heads * D] of x; a fused projection's output split by columns.
  Qkv project(Tensor x) {
    if (!qkv_proj) return {(*q_proj)(x), (*k_proj)(x), (*v_proj)(x)};
    const LlamaConfig& c = s_->cfg;
    const int64_t q_out = c.num_attention_heads * c.head_dim,
                  kv_out = c.num_key_value_heads * c.head_dim;
    Tensor qkv = (*qkv_proj)(x);
    const int d = int(qkv.ndim()) - 1;
    return {qkv.narrow(d, 0, q_out).contiguous(), qkv.narrow(d, q_out, kv_out).contiguous(),
            qkv.narrow(d, q_out + kv_out, kv_out).contiguous()};
  }

  // [B, T, Hkv, D] -> [B, H, T, D]: query head h reads key/value head h / (H / Hkv).
  static Tensor repeat_kv(Tensor x, int64_t H) {
    const int64_t B = x.size(0), T = x.size(1), Hkv = x.size(2), D = x.size(3);
    Tensor heads = x.permute({0, 2, 1, 3});
    if (Hkv == H) return heads;
    return heads.contiguous()
        .reshape({B * Hkv, 1, T, D})
        .expand({B * Hkv, H / Hkv, T, D})
        .reshape({B, H, T, D});
  }

  // Causal attention of q [..., T, D] over k and v whose dim 1 may be 1 where
  // q's is G (grouped heads); the fused primitive (k and v broadcast over G,
  // which its kernel packs once per key/value head) unless a sliding window or
  // dropout on the weights needs the weights themselves (then matmul
  // broadcasts k and v).
  Tensor attend(Tensor q, Tensor k, Tensor v, int64_t T) {
    const LlamaConfig& c = s_->cfg;
    const float scale = float(1.0 / std::sqrt(double(c.head_dim)));
    const bool window = c.sliding_window > 0 && c.sliding_window < T;
    const bool drop = training() && c.attention_dropout > 0.0f;
    if (!window && !drop) {
      // Packed examples: segment ids [B, T] (or [1, T] for one row), one row
      // per batch row of q's heads.
      const Shape grouped = q.shape();
      AttentionOptions o;
      o.scale = scale;
      o.causal = true;
      o.segments = s_->packing.segments;
      return attention(q, k.expand(grouped), v.expand(grouped), o);
    }
    if (s_->packing.segments.defined())
      fail("models", "LlamaForCausalLM: packed examples take the fused attention, not a sliding ",
           "window or attention dropout (pad the examples instead: --no-packing)");
    SoftmaxOptions so;
    so.scale = scale;
    so.causal = true;
    if (window) {  // key j is visible to query i when i - W < j <= i (causal from the flag)
      Tensor pos = s_->positions.narrow(0, 0, T);
      Tensor dist = pos.reshape({T, 1}) - pos.reshape({1, T});  // i - j
      Tensor far = gt(dist, float(c.sliding_window) - 0.5f);
      so.mask = where(far, full(ctx(), {1}, -INFINITY), full(ctx(), {1}, 0.0f));
    }
    Tensor att = softmax(matmul(q, k.T()), so);
    if (drop) att = dropout(att, c.attention_dropout, path_seed(), true, dropout_seed_tensor());
    return matmul(att, v);
  }

  std::shared_ptr<const LlamaShared> s_;
};

class LlamaMLP : public nn::Module {
 public:
  LlamaMLP(Context& ctx, const LlamaConfig& c) : Module(ctx), inter_(c.intermediate_size) {
    if (c.fused_projections) {
      gate_up_proj = &add<nn::Linear>("gate_up_proj", c.hidden_size, 2 * inter_, c.mlp_bias);
    } else {
      gate_proj = &add<nn::Linear>("gate_proj", c.hidden_size, inter_, c.mlp_bias);
      up_proj = &add<nn::Linear>("up_proj", c.hidden_size, inter_, c.mlp_bias);
    }
    down_proj = &add<nn::Linear>("down_proj", inter_, c.hidden_size, c.mlp_bias);
  }
  const char* type_name() const override { return "LlamaMLP"; }
  Tensor forward(Tensor x) override {
    if (!gate_up_proj) return (*down_proj)(silu((*gate_proj)(x)) * (*up_proj)(x));
    Tensor gu = (*gate_up_proj)(x);  // Phi-3: gate | up
    const int d = int(gu.ndim()) - 1;
    return (*down_proj)(silu(gu.narrow(d, 0, inter_).contiguous()) *
                        gu.narrow(d, inter_, inter_).contiguous());
  }
  // gate_proj and up_proj; or Phi-3's gate_up_proj (fused_projections).
  nn::Linear* gate_proj = nullptr;
  nn::Linear* up_proj = nullptr;
  nn::Linear* gate_up_proj = nullptr;
  nn::Linear* down_proj = nullptr;

 private:
  int64_t inter_;
};

class LlamaDecoderLayer : public nn::Module {
 public:
  LlamaDecoderLayer(Context& ctx, std::shared_ptr<const LlamaShared> s)
      : Module(ctx),
        self_attn(add<LlamaAttention>("self_attn", s)),
        mlp(add<LlamaMLP>("mlp", s->cfg)),
        input_layernorm(
            add<nn::RMSNorm>("input_layernorm", s->cfg.hidden_size, float(s->cfg.rms_norm_eps))),
        post_attention_layernorm(add<nn::RMSNorm>("post_attention_layernorm", s->cfg.hidden_size,
                                                  float(s->cfg.rms_norm_eps))) {}
  const char* type_name() const override { return "LlamaDecoderLayer"; }
  Tensor forward(Tensor x) override {
    x = x + self_attn(input_layernorm(x));
    return x + mlp(post_attention_layernorm(x));
  }
  LlamaAttention& self_attn;
  LlamaMLP& mlp;
  nn::RMSNorm& input_layernorm;
  nn::RMSNorm& post_attention_layernorm;
};

// HF's LlamaModel: the part under "model." (no head).
class LlamaModel : public nn::Module {
 public:
  LlamaModel(Context& ctx, const std::shared_ptr<const LlamaShared>& s)
      : Module(ctx),
        embed_tokens(add<nn::Embedding>("embed_tokens", s->cfg.vocab_size, s->cfg.hidden_size)),
        layers(add<nn::Sequential>("layers")),
        norm(add<nn::RMSNorm>("norm", s->cfg.hidden_size, float(s->cfg.rms_norm_eps))) {
    for (int64_t i = 0; i < s->cfg.num_hidden_layers; ++i) layers.push_back<LlamaDecoderLayer>(s);
  }
  const char* type_name() const override { return "LlamaModel"; }
  Tensor forward(Tensor ids) override { return norm(layers(embed_tokens(ids))); }
  nn::Embedding& embed_tokens;
  nn::Sequential& layers;
  nn::RMSNorm& norm;
};

class LlamaForCausalLM : public CausalLM {
 public:
  LlamaForCausalLM(Context& ctx, const ModelConfig& cfg, const ModelOptions& opt)
      : CausalLM(ctx),
        cfg_(cfg),
        shared_(make_shared(cfg, opt)),
        model(add<LlamaModel>("model", shared_)),
        lm_head(add<nn::Linear>("lm_head", cfg.llama->hidden_size, cfg.llama->vocab_size, false)) {
    if (shared_->cfg.tie_word_embeddings) lm_head.tie("weight", model.embed_tokens.weight());
    const LlamaConfig& c = shared_->cfg;
    std::vector<float> cos, sin;
    detail::rope_tables(c, shared_->max_seq, cos, sin);
    shared_->cos = constant({shared_->max_seq, c.rope_dims()}, std::move(cos), "rope.cos");
    shared_->sin = constant({shared_->max_seq, c.rope_dims()}, std::move(sin), "rope.sin");
    if (c.sliding_window > 0) {
      std::vector<float> pos(size_t(shared_->max_seq));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = float(i);
      shared_->positions = constant({shared_->max_seq}, std::move(pos), "positions");
    }
  }
  const char* type_name() const override { return "LlamaForCausalLM"; }

  Tensor forward(Tensor ids) override {
    check_allocated();
    if (ids.dtype() != i32 || ids.ndim() != 2)
      fail("models", type_name(), ": input ids must be i32 [B, T], got ", ids.label(), " ",
           dtype_name(ids.dtype()), " ", ids.shape().str());
    if (ids.size(1) > shared_->max_seq)
      fail("models", type_name(), ": sequence of ", ids.size(1), " tokens is longer than the ",
           shared_->max_seq, " positions of its RoPE tables (ModelOptions::max_seq_len)");
    return lm_head(model(ids));
  }
  bool supports_packing() const override {
    const LlamaConfig& c = shared_->cfg;
    return c.sliding_window <= 0 && c.attention_dropout <= 0.0f;
  }

  // forward() with the packing (segment ids, per-token RoPE rows) in the
  // shared state while the layers build their nodes.
  Tensor forward_packed(Tensor ids, Tensor segments, Tensor positions) override {
    check_allocated();
    if (ids.dtype() != i32 || ids.ndim() != 2)
      fail("models", type_name(), ": input ids must be i32 [B, T], got ", ids.label(), " ",
           dtype_name(ids.dtype()), " ", ids.shape().str());
    for (const Tensor& t : {segments, positions})
      if (!t.defined() || t.dtype() != i32 || t.shape() != ids.shape())
        fail("models", type_name(), ": packed segment ids and positions must be i32 ",
             ids.shape().str(), " like the ids, got ", t.defined() ? t.label() : "undefined", " ",
             t.defined() ? t.shape().str() : "");
    if (!supports_packing())
      fail("models", type_name(), ": packed examples take the fused attention, not a sliding ",
           "window or attention dropout (pad the examples instead: --no-packing)");
    const int64_t B = ids.size(0), T = ids.size(1), D = shared_->cfg.rope_dims();
    // Each token's RoPE angles: rows of the tables at its position (a
    // position past the tables is an index error of the gather).
    auto rows = [&](Tensor table) { return embedding(table, positions).reshape({B, T, D}); };
    shared_->packing = {segments, rows(shared_->cos), rows(shared_->sin)};
    struct Clear {
      LlamaShared& s;
      ~Clear() { s.packing = {}; }
    } clear{*shared_};
    return lm_head(model(ids));
  }

  KvLayout kv_layout() const override {
    const LlamaConfig& c = shared_->cfg;
    return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
  }

  Tensor forward_cached(KvStep& step) override {
    check_allocated();
    const int64_t T = step.ids.size(1), C = shared_->cfg.hidden_size;
    Tensor cos = detail::rows_at(shared_->cos, step.positions);
    Tensor sin = detail::rows_at(shared_->sin, step.positions);
    step.k_new.clear();
    step.v_new.clear();
    Tensor x = model.embed_tokens(step.ids);  // [1, T, hidden]
    for (size_t l = 0; l < model.layers.size(); ++l) {
      auto& layer = static_cast<LlamaDecoderLayer&>(model.layers[l]);
      x = x + layer.self_attn.forward_cached(layer.input_layernorm(x), step, l, cos, sin);
      x = x + layer.mlp(layer.post_attention_layernorm(x));
    }
    // Only the row whose logits are wanted goes through the final norm and the head.
    Tensor last = embedding(x.reshape({T, C}), step.last);  // [1, hidden]
    return lm_head(model.norm(last));
  }

  int64_t vocab_size() const override { return shared_->cfg.vocab_size; }
  int64_t max_seq_len() const override { return shared_->max_seq; }
  const ModelConfig& config() const override { return cfg_; }
  bool ignorable_tensor(const std::string& name) const override {
    if (name == "lm_head.weight") return shared_->cfg.tie_word_embeddings;
    // Old checkpoints saved RoPE's inverse frequencies; kiln computes its own.
    const std::string tail = "rotary_emb.inv_freq";
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  }

 private:
  static std::shared_ptr<LlamaShared> make_shared(const ModelConfig& cfg, const ModelOptions& opt) {
    if (!cfg.llama)
      fail("models", "make_llama: the config (model_type '", cfg.model_type,
           "') is not a Llama-family config");
    auto s = std::make_shared<LlamaShared>();
    s->cfg = *cfg.llama;
    s->max_seq = opt.max_seq_len > 0 ? opt.max_seq_len
                                     : std::min<int64_t>(s->cfg.max_position_embeddings, 4096);
    return s;
  }

  ModelConfig cfg_;
  std::shared_ptr<LlamaShared> shared_;

 public:
  LlamaModel& model;
  nn::Linear& lm_head;
};

}  // namespace

std::unique_ptr<CausalLM> make_llama(Context& ctx, const ModelConfig& cfg,
                                     const ModelOptions& opt) {
  auto m = std::make_unique<LlamaForCausalLM>(ctx, cfg, opt);
  detail::apply_weight_dtype(*m, opt);
  return m;
}

}  // namespace kiln::models
