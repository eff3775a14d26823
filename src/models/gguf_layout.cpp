// llama.cpp's GGUF names and row layouts (models/gguf_layout.h).
#include "models/gguf_layout.h"

#include <map>

#include "kiln/error.h"

namespace kiln::models::detail {

std::string arch_of(const ModelConfig& c) {
  if (c.gpt2) return "gpt2";
  const std::string& t = c.llama->model_type;
  return t == "llama" || t == "mistral" ? "llama" : t;
}

std::string gguf_name(const std::string& hf, bool gpt2) {
  static const std::map<std::string, std::string> llama_top = {
      {"model.embed_tokens", "token_embd"}, {"model.norm", "output_norm"}, {"lm_head", "output"}};
  static const std::map<std::string, std::string> llama_layer = {
      {"input_layernorm", "attn_norm"},    {"self_attn.q_proj", "attn_q"},
      {"self_attn.k_proj", "attn_k"},      {"self_attn.v_proj", "attn_v"},
      {"self_attn.o_proj", "attn_output"}, {"self_attn.q_norm", "attn_q_norm"},
      {"self_attn.k_norm", "attn_k_norm"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_proj", "ffn_gate"},       {"mlp.up_proj", "ffn_up"},
      {"mlp.down_proj", "ffn_down"}};
  static const std::map<std::string, std::string> gpt2_top = {
      {"wte", "token_embd"}, {"wpe", "position_embd"}, {"ln_f", "output_norm"}};
  static const std::map<std::string, std::string> gpt2_layer = {
      {"ln_1", "attn_norm"}, {"attn.c_attn", "attn_qkv"}, {"attn.c_proj", "attn_output"},
      {"ln_2", "ffn_norm"},  {"mlp.c_fc", "ffn_up"},      {"mlp.c_proj", "ffn_down"}};
  const size_t dot = hf.rfind('.');
  KILN_ASSERT(dot != std::string::npos);
  const std::string module = hf.substr(0, dot), suffix = hf.substr(dot);  // ".weight"
  const std::string layers = gpt2 ? "h." : "model.layers.";
  if (module.rfind(layers, 0) == 0) {
    const size_t end = module.find('.', layers.size());
    KILN_ASSERT(end != std::string::npos);
    const std::string n = module.substr(layers.size(), end - layers.size());
    const auto& table = gpt2 ? gpt2_layer : llama_layer;
    return "blk." + n + "." + table.at(module.substr(end + 1)) + suffix;
  }
  return (gpt2 ? gpt2_top : llama_top).at(module) + suffix;
}

Layout layout_of(const std::string& hf, const ModelConfig& c, int64_t* heads) {
  if (c.gpt2) {
    const bool conv = hf.find(".attn.c_attn.weight") != std::string::npos ||
                      hf.find(".attn.c_proj.weight") != std::string::npos ||
                      hf.find(".mlp.c_fc.weight") != std::string::npos ||
                      hf.find(".mlp.c_proj.weight") != std::string::npos;
    return conv ? Layout::transposed : Layout::same;
  }
  if (arch_of(c) != "llama") return Layout::same;
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

}  // namespace kiln::models::detail
