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
// Or as one GGUF file in llama.cpp's adapter format (what its
// convert_lora_to_gguf.py writes and `llama-cli --lora` / node-llama-cpp load):
//
//   kiln::models::save_lora_gguf(*model, "out/adapter.gguf");
//   kiln::models::load_lora(*model, cpu, "out/adapter.gguf");  // by the extension
//   kiln::models::convert_lora("my-adapter", "my-adapter.gguf", "Llama-3.2-1B");
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

// Loads the adapter at `path` into `model` as adapter `name`: a PEFT
// directory, or a GGUF adapter file (a path ending in .gguf; see
// save_lora_gguf). PEFT: matches the config's target_modules against the
// model's Linear-like layers (by Hugging Face's module names and kiln's) and
// checks every tensor of the file (name, dtype F32/F16/BF16, shape [r, in] /
// [out, r]; nothing missing, nothing extra). GGUF: checks general.type,
// adapter.type and that general.architecture is the base's, and that every
// tensor is one of a "<weight>.lora_a" / ".lora_b" pair for a Linear weight of
// the model, of shapes [r, in] / [out, r] (one r). Only then is the adapter
// added (nn::add_lora_at: it becomes active and trainable, the rest frozen)
// and read. Errors are kiln::Error "[models] <file>: ..." naming the file and
// tensor or field. A GGUF adapter's config: r from its shapes, lora_alpha
// adapter.lora.alpha (r when it is 0 or absent: llama.cpp's scale 1),
// target_modules the adapted layers' names, no dropout.
LoraFileConfig load_lora(CausalLM& model, Backend& backend, const std::string& path,
                         const std::string& name = "default");

// Writes adapter `name` of `model` to `dir` (created if needed) in PEFT's
// layout, each file atomically: F32 tensors, the config as added.
void save_lora(const CausalLM& model, const std::string& dir, const std::string& name = "default",
               const std::string& base_model_name_or_path = "");

// Writes adapter `name` of `model` as one GGUF file (atomically) in llama.cpp's
// adapter format: general.type "adapter", general.architecture the base's
// ("llama", "qwen2", "qwen3", "gpt2"), adapter.type "lora", adapter.lora.alpha
// (f32), and for each adapted layer F32 tensors "<GGUF weight name>.lora_a"
// (A, [r, in]) and ".lora_b" (B, [out, r]), e.g. "blk.0.attn_q.weight.lora_a";
// for the "llama" architecture B's rows of q and k in the order llama.cpp's
// files store those weights. llama.cpp scales by alpha / r, so an rsLoRA
// adapter (alpha / sqrt(r)) is written with alpha * sqrt(r). An adapter on a
// head tied to the token embedding (which llama.cpp's files do not store
// apart) is an error.
void save_lora_gguf(const CausalLM& model, const std::string& path,
                    const std::string& name = "default");

// Converts an adapter between PEFT's directory and llama.cpp's GGUF file, the
// direction by the paths (`out` ending in .gguf: GGUF; else a PEFT
// directory). `base_model` is the base the adapter belongs to (a Hugging Face
// directory or a GGUF file): only its config is read, for the layer names,
// shapes and llama.cpp's q/k row order; no weights are loaded or allocated.
// A PEFT directory written from a GGUF adapter names `base_model` as
// base_model_name_or_path.
void convert_lora(const std::string& in, const std::string& out, const std::string& base_model);

}  // namespace kiln::models
