// GPT-2 (GPT2LMHeadModel), with the parameter names and layouts of the hub's
// files: learned positions, pre-LN blocks, tanh GELU, and HF's Conv1D linear
// layers whose weights are stored [in, out] (kept that way here: y = x W + b).
#include <cmath>
#include <memory>

#include "kiln/models.h"
#include "models/kv_attention.h"
#include "models/weight_quant.h"

namespace kiln::models {
namespace {

// HF's Conv1D: weight [in, out], bias [out], y = x W + b (nn::LinearBase with
// fan_in_fan_out, so LoRA adapters attach to it). Initialised as HF does,
// N(0, 0.02) weights and zero bias.
class Conv1D : public nn::LinearBase {
 public:
  Conv1D(Context& ctx, int64_t in, int64_t out) : LinearBase(ctx, in, out, true, true) {}
  const char* type_name() const override { return "Conv1D"; }
  void reset_parameters(uint64_t seed) override {
    init_normal(weight(), 0.0f, 0.02f, seed);
    bias().fill_zero();
  }
};

class Gpt2Attention : public nn::Module {
 public:
  Gpt2Attention(Context& ctx, const Gpt2Config& c)
      : Module(ctx),
        c_attn(add<Conv1D>("c_attn", c.n_embd, 3 * c.n_embd)),
        c_proj(add<Conv1D>("c_proj", c.n_embd, c.n_embd)),
        resid_dropout(add<nn::Dropout>("resid_dropout", c.resid_pdrop)),
        c_(c) {}
  const char* type_name() const override { return "GPT2Attention"; }
  Tensor forward(Tensor x) override {
    const int64_t B = x.size(0), T = x.size(1), C = c_.n_embd, H = c_.n_head, D = C / H;
    Tensor qkv = c_attn(x);  // [B, T, 3C]: q | k | v
    auto head = [&](int i) {
      return qkv.narrow(2, i * C, C).reshape({B, T, H, D}).permute({0, 2, 1, 3});
    };
    nn::SdpaOptions o;
    o.causal = true;
    o.dropout = c_.attn_pdrop;
    o.training = training();
    if (o.training && o.dropout > 0.0f) {
      o.seed = path_seed();
      o.seed_tensor = dropout_seed_tensor();
    }
    Tensor y = nn::scaled_dot_product_attention(head(0), head(1), head(2), o);
    return resid_dropout(c_proj(y.permute({0, 2, 1, 3}).reshape({B, T, C})));
  }
  // The new tokens x [1, T, C] of a KvStep; appends this layer's new keys and
  // values to step.k_new / v_new.
  Tensor forward_cached(Tensor x, KvStep& step, size_t layer) {
    const int64_t T = x.size(1), C = c_.n_embd, H = c_.n_head, D = C / H;
    Tensor qkv = c_attn(x);  // [1, T, 3C]: q | k | v
    auto part = [&](int i) { return qkv.narrow(2, i * C, C).contiguous().reshape({T, H, D}); };
    Tensor q = part(0), k = part(1), v = part(2);
    step.k_new.push_back(k);
    step.v_new.push_back(v);
    const float scale = float(1.0 / std::sqrt(double(D)));
    return c_proj(detail::cached_attention(q, k, v, step, layer, scale));
  }

  Conv1D& c_attn;
  Conv1D& c_proj;
  nn::Dropout& resid_dropout;

 private:
  Gpt2Config c_;
};

class Gpt2Mlp : public nn::Module {
 public:
  Gpt2Mlp(Context& ctx, const Gpt2Config& c)
      : Module(ctx),
        c_fc(add<Conv1D>("c_fc", c.n_embd, inner(c))),
        c_proj(add<Conv1D>("c_proj", inner(c), c.n_embd)),
        dropout(add<nn::Dropout>("dropout", c.resid_pdrop)),
        approx_(c.gelu_tanh ? GeluApprox::tanh : GeluApprox::none) {}
  const char* type_name() const override { return "GPT2MLP"; }
  Tensor forward(Tensor x) override { return dropout(c_proj(gelu(c_fc(x), approx_))); }
  static int64_t inner(const Gpt2Config& c) { return c.n_inner > 0 ? c.n_inner : 4 * c.n_embd; }
  Conv1D& c_fc;
  Conv1D& c_proj;
  nn::Dropout& dropout;

 private:
  GeluApprox approx_;
};

class Gpt2Block : public nn::Module {
 public:
  Gpt2Block(Context& ctx, const Gpt2Config& c)
      : Module(ctx),
        ln_1(add<nn::LayerNorm>("ln_1", c.n_embd, float(c.layer_norm_epsilon))),
        attn(add<Gpt2Attention>("attn", c)),
        ln_2(add<nn::LayerNorm>("ln_2", c.n_embd, float(c.layer_norm_epsilon))),
        mlp(add<Gpt2Mlp>("mlp", c)) {}
  const char* type_name() const override { return "GPT2Block"; }
  Tensor forward(Tensor x) override {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }
  nn::LayerNorm& ln_1;
  Gpt2Attention& attn;
  nn::LayerNorm& ln_2;
  Gpt2Mlp& mlp;
};

class Gpt2LMHeadModel : public CausalLM {
 public:
  Gpt2LMHeadModel(Context& ctx, const ModelConfig& cfg)
      : CausalLM(ctx),
        cfg_(checked(cfg)),
        wte(add<nn::Embedding>("wte", c().vocab_size, c().n_embd)),
        wpe(add<nn::Embedding>("wpe", c().n_positions, c().n_embd)),
        drop(add<nn::Dropout>("drop", c().embd_pdrop)),
        h(add<nn::Sequential>("h")),
        ln_f(add<nn::LayerNorm>("ln_f", c().n_embd, float(c().layer_norm_epsilon))),
        lm_head(add<nn::Linear>("lm_head", c().n_embd, c().vocab_size, false)) {
    for (int64_t i = 0; i < c().n_layer; ++i) h.push_back<Gpt2Block>(c());
    lm_head.tie("weight", wte.weight());  // GPT-2's head is its token embedding
  }
  const char* type_name() const override { return "GPT2LMHeadModel"; }

  Tensor forward(Tensor ids) override {
    if (ids.dtype() != i32 || ids.ndim() != 2)
      fail("models", type_name(), ": input ids must be i32 [B, T], got ", ids.label(), " ",
           dtype_name(ids.dtype()), " ", ids.shape().str());
    const int64_t T = ids.size(1);
    if (T > c().n_positions)
      fail("models", type_name(), ": sequence of ", T, " tokens is longer than its ",
           c().n_positions, " learned positions (n_positions)");
    Tensor pos = wpe.weight().narrow(0, 0, T);
    if (pos.dtype() != f32) pos = pos.to(f32);  // kept f16/bf16: only the rows used
    Tensor x = drop(wte(ids) + pos);
    return lm_head(ln_f(h(x)));
  }
  KvLayout kv_layout() const override { return {c().n_layer, c().n_head, c().n_embd / c().n_head}; }

  Tensor forward_cached(KvStep& step) override {
    const int64_t T = step.ids.size(1), C = c().n_embd;
    step.k_new.clear();
    step.v_new.clear();
    Tensor x = wte(step.ids) + detail::rows_at(wpe.weight(), step.positions);  // [1, T, C]
    for (size_t l = 0; l < h.size(); ++l) {
      auto& blk = static_cast<Gpt2Block&>(h[l]);
      x = x + blk.attn.forward_cached(blk.ln_1(x), step, l);
      x = x + blk.mlp(blk.ln_2(x));
    }
    // Only the row whose logits are wanted goes through ln_f and the head.
    return lm_head(ln_f(embedding(x.reshape({T, C}), step.last)));
  }

  int64_t vocab_size() const override { return c().vocab_size; }
  int64_t max_seq_len() const override { return c().n_positions; }
  const ModelConfig& config() const override { return cfg_; }
  bool ignorable_tensor(const std::string& name) const override {
    // The causal-mask buffers older checkpoints saved, and the tied head.
    auto ends = [&](const std::string& t) {
      return name.size() >= t.size() && name.compare(name.size() - t.size(), t.size(), t) == 0;
    };
    return name == "lm_head.weight" || ends(".attn.bias") || ends(".attn.masked_bias");
  }
  // GPT2LMHeadModel.state_dict() says "transformer.h.0..."; the hub's files "h.0...".
  std::string alternate_name(const std::string& name) const override {
    return "transformer." + name;
  }

 private:
  static const ModelConfig& checked(const ModelConfig& cfg) {
    if (!cfg.gpt2)
      fail("models", "make_gpt2: the config (model_type '", cfg.model_type,
           "') is not a GPT-2 config");
    return cfg;
  }
  const Gpt2Config& c() const { return *cfg_.gpt2; }
  ModelConfig cfg_;

 public:
  nn::Embedding& wte;
  nn::Embedding& wpe;
  nn::Dropout& drop;
  nn::Sequential& h;
  nn::LayerNorm& ln_f;
  nn::Linear& lm_head;
};

}  // namespace

std::unique_ptr<CausalLM> make_gpt2(Context& ctx, const ModelConfig& cfg, const ModelOptions& opt) {
  auto m = std::make_unique<Gpt2LMHeadModel>(ctx, cfg);
  detail::apply_weight_dtype(*m, opt);
  return m;
}

}  // namespace kiln::models
