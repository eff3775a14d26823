// kiln-lm export-adapter: converts a LoRA adapter between PEFT's directory
// (adapter_config.json + adapter_model.safetensors) and one GGUF file in
// llama.cpp's adapter format, the direction by OUT (ending in .gguf: GGUF).
// --model names the base (a Hugging Face directory or a GGUF file): only its
// config is read (layer names, shapes, llama.cpp's q/k row order).
//   kiln-lm export-adapter out/adapter out/adapter.gguf --model path/to/base
//   kiln-lm export-adapter out/adapter.gguf out/adapter-peft --model base.gguf
#include <cstdio>
#include <memory>
#include <string>

#include "commands.h"
#include "kiln/lora.h"

namespace lm {

namespace {

struct ExportAdapterOptions {
  std::string in, out, model;
};

}  // namespace

Command add_export_adapter(CLI::App& app) {
  auto o = std::make_shared<ExportAdapterOptions>();
  CLI::App* s = app.add_subcommand(
      "export-adapter",
      "convert a LoRA adapter between PEFT's directory and llama.cpp's GGUF adapter file");
  s->add_option("in", o->in, "the adapter: a PEFT directory or a .gguf file")->required();
  s->add_option("out", o->out, "FILE.gguf (llama.cpp's format) or a directory (PEFT's)")
      ->required();
  s->add_option("--model", o->model,
                "the base model (Hugging Face directory or .gguf file; only its config is read)")
      ->required();
  return {s, [o] {
            kiln::models::convert_lora(o->in, o->out, o->model);
            std::printf("wrote %s\n", o->out.c_str());
            return 0;
          }};
}

}  // namespace lm
