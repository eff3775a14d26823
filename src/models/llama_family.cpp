// What the Llama-family rows (llama_arch.cpp, phi3_arch.cpp) share: the
// config.json fields and GGUF keys they spell alike (llama_family.h).
#include "models/llama_family.h"

namespace kiln::models::detail {

void read_llama_common(Fields& f, LlamaConfig& c) {
  c.vocab_size = f.positive("vocab_size", 0);
  c.hidden_size = f.positive("hidden_size", 0);
  c.intermediate_size = f.positive("intermediate_size", 0);
  c.num_hidden_layers = f.positive("num_hidden_layers", 0);
  c.num_attention_heads = f.positive("num_attention_heads", 0);
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.positive("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = f.positive("max_position_embeddings", 2048);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (c.head_dim % 2 != 0)
    f.fail_field("head_dim", "(" + std::to_string(c.head_dim) + ") must be even for RoPE");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_dropout = float(f.number("attention_dropout", 0.0));
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu")
    f.fail_field("hidden_act", "is '" + act + "': kiln's " + c.model_type + " uses silu");
}

void check_llama_common(Fields& f, const LlamaConfig& c) {
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail_field("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                            ") must divide num_attention_heads (" +
                                            std::to_string(c.num_attention_heads) + ")");
  if (!(c.rms_norm_eps > 0)) f.fail_field("rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0)) f.fail_field("rope_theta", "must be > 0");
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1))
    f.fail_field("attention_dropout", "must be in [0, 1)");
}

void write_llama_common(const LlamaConfig& c, Json& j) {
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  if (!c.rope_freq_factors.empty())
    fail("models", "config_json: RoPE frequency factors (a GGUF file's rope_freqs) have no ",
         "config.json form; rope_scaling parameters do");
  if (c.rope_scaling) {
    j["rope_scaling"] = rope_scaling_json(*c.rope_scaling);
  } else {
    j["rope_scaling"] = nullptr;
  }
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  j["attention_dropout"] = c.attention_dropout;
}

void read_gguf_llama_common(GgufMeta& m, LlamaConfig& c) {
  const GgufFile& f = m.file();
  c.vocab_size = gguf_vocab_size(m);
  c.max_position_embeddings = m.integer("context_length");
  c.hidden_size = m.integer("embedding_length");
  c.num_hidden_layers = m.integer("block_count");
  c.intermediate_size = m.integer("feed_forward_length");
  c.num_attention_heads = m.integer("attention.head_count");
  c.num_key_value_heads = m.integer("attention.head_count_kv", c.num_attention_heads);
  c.head_dim = m.integer("attention.key_length", c.hidden_size / c.num_attention_heads);
  if (m.integer("attention.value_length", c.head_dim) != c.head_dim)
    m.fail_key("attention.value_length", "differs from key_length: not supported");
  c.rms_norm_eps = m.number("attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = m.number("rope.freq_base", 10000.0);
  c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
  if (c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim % 2 != 0)
    m.fail_key("attention.head_count_kv", "must divide head_count, and the head dim be even");
}

void write_gguf_llama_common(const LlamaConfig& c, const std::string& k, GgufWriter& w) {
  auto u32 = [](int64_t x) { return GgufValue(uint32_t(x)); };
  w.set(k + "context_length", u32(c.max_position_embeddings));
  w.set(k + "embedding_length", u32(c.hidden_size));
  w.set(k + "feed_forward_length", u32(c.intermediate_size));
  w.set(k + "block_count", u32(c.num_hidden_layers));
  w.set(k + "attention.head_count", u32(c.num_attention_heads));
  w.set(k + "attention.head_count_kv", u32(c.num_key_value_heads));
  w.set(k + "attention.key_length", u32(c.head_dim));
  w.set(k + "attention.value_length", u32(c.head_dim));
  w.set(k + "rope.freq_base", float(c.rope_theta));
  w.set(k + "attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
  w.set(k + "vocab_size", u32(c.vocab_size));
}

// llama.cpp's rope.scaling.* keys: type "linear" (factor) or "yarn" (factor,
// original_context_length, yarn_beta_fast/slow); "none" or no type: none (Llama
// 3's scaling comes as the rope_freqs tensor). Keys kiln does not apply
// (attn_factor, yarn_ext_factor, yarn_attn_factor, yarn_log_multiplier) stay
// unread, so the file is refused naming them.
std::optional<RopeScaling> gguf_rope_scaling(GgufMeta& m, int64_t context) {
  m.find("rope.scaling.finetuned");  // bookkeeping: changes nothing computed
  std::string type = "none";
  if (const GgufValue* t = m.find("rope.scaling.type")) type = t->as_string();
  const GgufValue* old_linear = m.find("rope.scale_linear");  // older files' linear factor
  if (type == "none" && old_linear && old_linear->as_float() != 1.0) type = "linear";
  if (type == "none") return std::nullopt;
  if (type != "linear" && type != "yarn")
    m.fail_key("rope.scaling.type",
               "is '" + type +
                   "', which kiln does not support in GGUF files (supported: none, linear, yarn; "
                   "Llama 3's scaling comes as the rope_freqs tensor)");
  RopeScaling r;
  const GgufValue* factor = m.find("rope.scaling.factor");
  if (!factor) factor = old_linear;
  r.factor = factor ? factor->as_float() : 0.0;
  if (!(r.factor > 0))
    m.fail_key("rope.scaling.factor", "must be given and > 0 for rope.scaling.type '" + type + "'");
  r.type = type == "linear" ? RopeScaling::Type::linear : RopeScaling::Type::yarn;
  if (r.type == RopeScaling::Type::yarn) {
    r.original_max_position_embeddings = m.integer("rope.scaling.original_context_length", context);
    r.beta_fast = m.number("rope.scaling.yarn_beta_fast", 32.0);
    r.beta_slow = m.number("rope.scaling.yarn_beta_slow", 1.0);
    if (!(r.beta_fast > 0) || !(r.beta_slow > 0))
      m.fail_key("rope.scaling.yarn_beta_fast", "and yarn_beta_slow must be > 0");
  }
  return r;
}

void write_gguf_rope_scaling(const RopeScaling& r, const std::string& k, GgufWriter& w,
                             const std::string& path) {
  if (r.type == RopeScaling::Type::linear) {
    w.set(k + "rope.scaling.type", "linear");
    w.set(k + "rope.scaling.factor", float(r.factor));
    return;
  }
  // llama.cpp's YaRN is transformers' with the default attention factor
  // (0.1 ln(factor) + 1) and the ramp's ends rounded outwards.
  if (r.attention_factor || r.mscale != 0 || r.mscale_all_dim != 0 || !r.truncate)
    fail("models", path, ": yarn rope scaling with attention_factor, mscale or truncate ",
         "false has no GGUF form kiln writes (llama.cpp's keys cannot say it)");
  w.set(k + "rope.scaling.type", "yarn");
  w.set(k + "rope.scaling.factor", float(r.factor));
  w.set(k + "rope.scaling.original_context_length", uint32_t(r.original_max_position_embeddings));
  w.set(k + "rope.scaling.yarn_beta_fast", float(r.beta_fast));
  w.set(k + "rope.scaling.yarn_beta_slow", float(r.beta_slow));
}

const NameMap& llama_top_gguf_names() {
  static const NameMap top = {
      {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};
  return top;
}

RecipeModel llama_recipe_model(const ModelConfig& cfg) {
  RecipeModel m;
  m.n_layer = cfg.llama->num_hidden_layers;
  m.n_gqa = cfg.llama->num_attention_heads / cfg.llama->num_key_value_heads;
  return m;
}

ArchHooks llama_family_hooks() {
  ArchHooks a{};
  a.layers = [](const ModelConfig& c) { return c.llama->num_hidden_layers; };
  a.layer_field = "num_hidden_layers";
  a.layer_prefixes = {"model.layers."};
  a.recipe_model = llama_recipe_model;
  a.embedding = "model.embed_tokens.weight";
  a.tied_head = [](const ModelConfig& c) { return c.llama->tie_word_embeddings; };
  a.make = make_llama;
  return a;
}

}  // namespace kiln::models::detail
