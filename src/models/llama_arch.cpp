// The Llama family's row of architectures.def (model_type llama, mistral,
// qwen2, qwen3; GGUF llama, qwen2, qwen3): config.json fields, GGUF metadata,
// tensor names and q/k row order; its modules are in llama.cpp.
#include <string>

#include "models/architecture.h"
#include "models/convert.h"
#include "models/llama_family.h"
#include "models/rope.h"

namespace kiln::models::detail {
namespace {

// "sliding_window" of Qwen2/Qwen3 applies only with use_sliding_window (and then
// only to some layers): kiln runs them with full attention or refuses.
void llama_read_qwen_window(Fields& f) {
  if (f.boolean("use_sliding_window", false))
    f.fail_field("use_sliding_window",
                 "is true: kiln does not implement Qwen's per-layer sliding window");
  f.ignore({"sliding_window", "max_window_layers"});
  const Json& types = f.get("layer_types");
  if (types.is_null()) return;
  if (!types.is_array()) f.fail_field("layer_types", "must be a list");
  for (const Json& t : types)
    if (t != "full_attention")
      f.fail_field("layer_types", "lists " + t.dump() + ": kiln supports full_attention only");
}

// Models whose HF code has no such biases: the fields may appear, but only false.
void llama_no_bias_fields(Fields& f) {
  require_field(f, "attention_bias", false, false,
                "must be false: this architecture has no such biases");
  require_field(f, "mlp_bias", false, false, "must be false: this architecture has no such biases");
}

void llama_read_config(Fields& f, ModelConfig& cfg) {
  const std::string type = cfg.model_type;
  LlamaConfig c;
  c.model_type = type;
  read_llama_common(f, c);
  read_llama_rope_fields(f, c, c.head_dim);
  if (type == "llama") {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.mlp_bias = f.boolean("mlp_bias", false);
    f.ignore("pretraining_tp");  // sliced matmuls in HF: the same function
  } else if (type == "mistral") {
    llama_no_bias_fields(f);
    c.sliding_window = f.integer("sliding_window", 0);
    if (c.sliding_window < 0) f.fail_field("sliding_window", "must be positive or null");
  } else if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases (and no o_proj bias)
    llama_no_bias_fields(f);
    llama_read_qwen_window(f);
  } else if (type == "qwen3") {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.qk_norm = true;
    require_field(f, "mlp_bias", false, false, "is not supported by kiln's qwen3");
    llama_read_qwen_window(f);
  }
  check_llama_common(f, c);
  cfg.llama = c;
}

void llama_write_config(const ModelConfig& cfg, Json& j) {
  const LlamaConfig& c = *cfg.llama;
  static const std::map<std::string, std::string> classes = {{"llama", "LlamaForCausalLM"},
                                                             {"mistral", "MistralForCausalLM"},
                                                             {"qwen2", "Qwen2ForCausalLM"},
                                                             {"qwen3", "Qwen3ForCausalLM"}};
  j["architectures"] = {classes.at(c.model_type)};
  write_llama_common(c, j);
  if (c.model_type == "llama") {
    j["attention_bias"] = c.qkv_bias;
    j["mlp_bias"] = c.mlp_bias;
  } else if (c.model_type == "mistral") {
    if (c.sliding_window > 0) {
      j["sliding_window"] = c.sliding_window;
    } else {
      j["sliding_window"] = nullptr;
    }
  } else {
    if (c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
    j["use_sliding_window"] = false;
  }
}

std::string llama_gguf_arch(const ModelConfig& cfg) {
  const std::string& t = cfg.llama->model_type;
  return t == "llama" || t == "mistral" ? "llama" : t;
}

void llama_read_gguf(GgufMeta& m, ModelConfig& cfg) {
  const GgufFile& f = m.file();
  const std::string& arch = m.arch();
  LlamaConfig c;
  read_gguf_llama_common(m, c);
  if (m.integer("rope.dimension_count", c.head_dim) != c.head_dim)
    m.fail_key("rope.dimension_count", "differs from the head dim: partial RoPE is not supported");
  c.rope_scaling = gguf_rope_scaling(m, c.max_position_embeddings);
  c.sliding_window = m.integer("attention.sliding_window", 0);
  c.model_type = arch == "llama" && c.sliding_window > 0 ? "mistral" : arch;
  c.qkv_bias = arch == "qwen2" || f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
  c.mlp_bias = f.find_tensor("blk.0.ffn_gate.bias") != nullptr;
  c.qk_norm = arch == "qwen3";
  if (const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->dtype != f32 || rf->quantized() || rf->shape.numel() != c.head_dim / 2)
      fail("models", f.path(), ": tensor 'rope_freqs.weight' must be f32 [", c.head_dim / 2,
           "], got ", dtype_name(rf->dtype), " ", rf->shape.str());
    c.rope_freq_factors = to_f32(f.read_bytes("rope_freqs.weight"), f32);
  }
  cfg.model_type = c.model_type;
  cfg.llama = c;
}

void llama_write_gguf(const ModelConfig& cfg, GgufWriter& w, const std::string& path) {
  const LlamaConfig& c = *cfg.llama;
  const std::string k = llama_gguf_arch(cfg) + ".";
  write_gguf_llama_common(c, k, w);
  w.set(k + "rope.dimension_count", uint32_t(c.head_dim));
  if (c.sliding_window > 0) w.set(k + "attention.sliding_window", uint32_t(c.sliding_window));
  using T = RopeScaling::Type;
  const std::optional<RopeScaling>& rs = c.rope_scaling;
  if (rs && (rs->type == T::linear || rs->type == T::yarn)) {
    write_gguf_rope_scaling(*rs, k, w, path);
  } else if (rs && rs->type != T::llama3) {
    fail("models", path, ": rope scaling '", rope_scaling_name(rs->type),
         "' has no GGUF form (llama.cpp's rope.scaling.type is none, linear, yarn or longrope ",
         "with Phi-3's tensors; kiln writes linear, yarn and llama3)");
  } else if (rs || !c.rope_freq_factors.empty()) {
    // Llama 3's scaling as llama.cpp stores it: a divisor per frequency.
    LlamaConfig plain = c;
    plain.rope_scaling.reset();
    plain.rope_freq_factors.clear();
    const std::vector<double> base = rope_inv_freq(plain), scaled = rope_inv_freq(c);
    std::vector<float> factors(base.size());
    for (size_t i = 0; i < base.size(); ++i) factors[i] = float(base[i] / scaled[i]);
    w.add_tensor_data("rope_freqs.weight", f32, {int64_t(factors.size())},
                      {reinterpret_cast<const uint8_t*>(factors.data()), factors.size() * 4});
  }
}

std::string llama_gguf_name(const std::string& hf) {
  static const NameMap layer = {
      {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  return mapped_gguf_name(hf, "model.layers.", llama_top_gguf_names(), layer);
}

// llama.cpp's "llama" architecture pairs adjacent dims in RoPE: its q and k rows
// are reordered (gguf_layout.h); qwen2 and qwen3 keep HF's order.
Layout llama_layout_of(const std::string& hf, const ModelConfig& c, int64_t* heads) {
  if (llama_gguf_arch(c) != "llama") return Layout::same;
  if (hf.find(".self_attn.q_proj.") != std::string::npos) {
    *heads = c.llama->num_attention_heads;
    return Layout::rope_pairs;
  }
  if (hf.find(".self_attn.k_proj.") != std::string::npos) {
    *heads = c.llama->num_key_value_heads;
    return Layout::rope_pairs;
  }
  return Layout::same;
}

// llama.cpp sizes as 70B the llama architecture with 80 layers and
// grouped-query attention, and Qwen2 with 80.
RecipeModel llama_arch_recipe_model(const ModelConfig& cfg) {
  RecipeModel m = llama_recipe_model(cfg);
  const std::string arch = llama_gguf_arch(cfg);
  const LlamaConfig& c = *cfg.llama;
  m.is_70b =
      c.num_hidden_layers == 80 &&
      ((arch == "llama" && c.num_attention_heads != c.num_key_value_heads) || arch == "qwen2");
  return m;
}

}  // namespace

const ArchHooks& arch_llama() {
  static const ArchHooks h = [] {
    ArchHooks a = llama_family_hooks();
    a.read_config = llama_read_config;
    a.write_config = llama_write_config;
    a.gguf_arch = llama_gguf_arch;
    a.read_gguf = llama_read_gguf;
    a.write_gguf = llama_write_gguf;
    a.gguf_extra_tensors = {"rope_freqs.weight"};
    a.gguf_name = llama_gguf_name;
    a.layout_of = llama_layout_of;
    a.recipe_model = llama_arch_recipe_model;
    return a;
  }();
  return h;
}

}  // namespace kiln::models::detail
