// LoRA (Hu et al. 2021) on kiln::nn models, with PEFT's conventions: adapters
// attach to the Linear-like layers (nn::LinearBase: Linear, GPT-2's Conv1D)
// whose module path matches the targets, as lora_A.<name> / lora_B.<name>
// sub-modules (PEFT's in-memory names), and add scaling * B(A(dropout(x))) to
// the layer's output. Files in PEFT's layout: kiln/lora.h.
//
//   model.freeze();                                  // add_lora does this too
//   kiln::nn::LoraConfig cfg{.r = 8, .alpha = 16,
//                            .target_modules = {"q_proj", "v_proj"}};
//   kiln::nn::add_lora(model, cpu, cfg);             // adapter "default", active
//   // ... train: OptConfig{.model = &model} trains the adapter's params only
//   kiln::nn::merge_lora(model);                     // W += scaling * B A
//
// Graphs read the adapter state when they are built (like train/eval): build
// graphs again after set_lora_adapter, merge_lora or unmerge_lora.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/nn.h"

namespace kiln::nn {

// PEFT's LoraConfig fields, same names and defaults.
struct LoraConfig {
  int64_t r = 8;
  float alpha = 8.0f;    // lora_alpha
  float dropout = 0.0f;  // lora_dropout, on the adapter's input
  // Layers by name: a module path equal to an entry or ending in "." + entry
  // ("q_proj" matches "model.layers.0.self_attn.q_proj").
  std::vector<std::string> target_modules;
  // Instead of target_modules: a regex the whole module path must match (PEFT's
  // target_modules given as one string).
  std::string target_regex;
  bool use_rslora = false;  // scaling alpha / sqrt(r) instead of alpha / r
  float scaling() const;
};

// Does `path` (a module path relative to the model) match cfg's targets?
bool lora_matches(const LoraConfig& cfg, const std::string& path);

// Adds adapter `name` to every nn::LinearBase of `model` whose path matches cfg
// and returns their paths. A is initialised as PEFT does (kaiming-uniform,
// a = sqrt(5), seeded from `seed` and the layer's path), B is zero, in new
// memory of `backend`. As PEFT's get_peft_model, the new adapter becomes the
// active one, its params are trainable and every other param of the model is
// frozen. Throws kiln::Error "[lora] ..." when nothing matches, when a matched
// module is not Linear-like, for r < 1 or when the name is taken.
std::vector<std::string> add_lora(Module& model, Backend& backend, const LoraConfig& cfg,
                                  const std::string& name = "default", uint64_t seed = 0);
// The same on the layers at `paths` (module paths relative to model), found by
// the caller (kiln/lora.h matches a file's targets against Hugging Face's
// module names); cfg's targets are recorded as given.
void add_lora_at(Module& model, Backend& backend, const LoraConfig& cfg,
                 const std::vector<std::string>& paths, const std::string& name = "default",
                 uint64_t seed = 0);

// The adapters' names, in the order they were added.
std::vector<std::string> lora_adapters(const Module& model);
// The config adapter `name` was added with (targets as given).
LoraConfig lora_config(const Module& model, const std::string& name);
// The layers that carry adapter `name`: path (relative to model) and layer.
std::vector<std::pair<std::string, LinearBase*>> lora_layers(const Module& model,
                                                             const std::string& name);

// Makes `name` the adapter graphs use ("": none, the base model alone), with
// its params trainable and the other adapters' frozen (PEFT's set_adapter). The
// base model is not reloaded: every adapter stays in memory. Throws while an
// adapter is merged.
void set_lora_adapter(Module& model, const std::string& name);
std::string active_lora_adapter(const Module& model);

// W += scaling * B A for the active adapter in every layer that has it
// (PEFT's merge_adapter); graphs built afterwards run the plain layers, and
// the base params (Module::named_base_parameters, what save_pretrained and
// save_gguf write) are the merged model. unmerge_lora subtracts it again (equal
// to the original weights up to float rounding). A quantized (q8_0/q4_0) base
// weight is dequantized and merged in f32, then kept f32 (a new param: build
// graphs again) or, with opt.requantize, quantized again to its dtype; the
// report counts both and gives the error re-quantizing added. An f16/bf16
// base weight is merged in f32 and kept f32 (counted in kept_f32; a new param).
MergeReport merge_lora(Module& model, const MergeOptions& opt = {});
void unmerge_lora(Module& model);

}  // namespace kiln::nn
