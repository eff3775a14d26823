// LoRA adapter files in PEFT's layout (docs/models.md, "Fine-tuning with LoRA"):
// a directory with adapter_model.safetensors, tensors named
// "base_model.model.<module path>.lora_A.weight" / ".lora_B.weight" (the
// module path as Hugging Face's model class has it: GPT-2's layers are
// "transformer.h.0.attn.c_attn"), and adapter_config.json (peft_type "LORA",
// r, lora_alpha, target_modules, lora_dropout, bias, use_rslora,
// base_model_name_or_path, fan_in_fan_out, ...).
//
//   auto model = kiln::models::load_pretrained(ctx, cpu, "Llama-3.2-1B");
//   kiln::models::load_lora(*model, cpu, "my-adapter");           // written by PEFT or kiln
//   kiln::models::load_lora(*model, cpu, "other-adapter", "other");
//   kiln::nn::set_lora_adapter(*model, "other");                  // the base is not reloaded
//   kiln::models::save_lora(*model, "out/adapter", "other", "meta-llama/Llama-3.2-1B");
//
// The adapters themselves (add_lora, merge_lora, ...) are kiln/nn/lora.h.
#pragma once
#include <string>
#include <string_view>

#include "kiln/backend.h"
#include "kiln/models.h"
#include "kiln/nn/lora.h"

namespace kiln::models {

// An adapter_config.json: the LoRA settings and the base model it names.
struct LoraFileConfig {
  nn::LoraConfig lora;
  std::string base_model_name_or_path;
  bool fan_in_fan_out = false;
};

// Parses adapter_config.json text; `file` names it in errors. Every field is
// used, known to change nothing kiln computes (task_type, inference_mode,
// init_lora_weights, ...), or must keep PEFT's default (modules_to_save,
// rank_pattern, alpha_pattern, use_dora, layers_to_transform, ... : kiln does
// not do them): anything else is "[models] <file>: field '<key>' ...".
LoraFileConfig parse_lora_config(std::string_view json, const std::string& file);
// The adapter_config.json text save_lora writes.
std::string lora_config_json(const LoraFileConfig& cfg);

// Loads the PEFT adapter in `dir` into `model` as adapter `name`: matches the
// config's target_modules against the model's Linear-like layers (by Hugging
// Face's module names and kiln's), checks every tensor of the file (name,
// dtype F32/F16/BF16, shape [r, in] / [out, r]; nothing missing, nothing
// extra) before anything is added, then adds the adapter (nn::add_lora_at:
// it becomes active and trainable, the rest frozen) and reads it. Errors are
// kiln::Error "[models] <file>: ..." naming the file and tensor or field.
LoraFileConfig load_lora(CausalLM& model, Backend& backend, const std::string& dir,
                         const std::string& name = "default");

// Writes adapter `name` of `model` to `dir` (created if needed) in PEFT's
// layout, each file atomically: F32 tensors, the config as added.
void save_lora(const CausalLM& model, const std::string& dir, const std::string& name = "default",
               const std::string& base_model_name_or_path = "");

}  // namespace kiln::models
