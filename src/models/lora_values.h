// A LoRA adapter as values on the host, between a model and its files: PEFT's
// directory (lora_adapter.cpp) and llama.cpp's GGUF adapter (lora_gguf.cpp).
// Reading checks a file against the model's layers (which need no memory:
// converting between the formats builds the base model and allocates nothing
// of it); adding puts the values into a model as a new adapter.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "kiln/lora.h"

namespace kiln::models::detail {

struct LoraLayerValues {
  std::string path;  // kiln's module path, e.g. "model.layers.0.self_attn.q_proj"
  const nn::LinearBase* layer = nullptr;
  std::vector<float> a, b;  // A [r, in] and B [out, r], row-major (PEFT's layout)
};

struct LoraValues {
  LoraFileConfig cfg;
  std::vector<LoraLayerValues> layers;  // in the model's tree order
};

// Every Linear-like layer of `model` outside adapters, with its kiln path, in
// tree order.
std::vector<std::pair<std::string, nn::LinearBase*>> linear_layers(const CausalLM& model);

// The module path Hugging Face's model class gives kiln's module `path`
// (GPT-2's GPT2LMHeadModel puts its layers under "transformer.").
std::string hf_path(const CausalLM& model, const std::string& path);

// The values of adapter `name` of `model` (its config as added).
LoraValues lora_values(const CausalLM& model, const std::string& name);

// Adds `v` to `model` as adapter `name` (nn::add_lora_at: active and
// trainable, the rest frozen) and writes its values.
void add_lora_values(CausalLM& model, Backend& backend, const LoraValues& v,
                     const std::string& name);

// PEFT's directory: read (checked against the model's layers) and written.
LoraValues read_peft_lora(const CausalLM& model, const std::string& dir);
void write_peft_lora(const CausalLM& model, const std::string& dir, const LoraValues& v);

// llama.cpp's GGUF LoRA adapter: read (checked against the model's layers and
// architecture) and written.
LoraValues read_gguf_lora(const CausalLM& model, const std::string& path);
void write_gguf_lora(const CausalLM& model, const std::string& path, const LoraValues& v);

}  // namespace kiln::models::detail
