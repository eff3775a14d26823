// What kiln-lm's model subcommands share: loading a model (a Hugging Face
// directory or a .gguf file) with its tokenizer when it has one, and reading
// token ids from the command line.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/cpu.h"
#include "kiln/generate.h"
#include "kiln/tokenizer.h"

namespace lm {

struct LoadedModel {
  kiln::Context ctx;
  std::unique_ptr<kiln::CpuBackend> cpu;
  std::unique_ptr<kiln::models::CausalLM> model;
  // tokenizer.json of the directory, or the GGUF file's tokenizer.ggml.* vocabulary.
  std::optional<kiln::Tokenizer> tokenizer;
  double load_seconds = 0;
};

// `max_seq_len` 0: the model's default (ModelOptions::max_seq_len). `weights`:
// ModelOptions::weight_dtype; a GGUF file with Q8_0/Q4_0 tensors keeps them
// quantized unless `weights` asks for another quantized type.
std::unique_ptr<LoadedModel> load_model(
    const std::string& path, int threads, int64_t max_seq_len = 0,
    kiln::models::ModelOptions::WeightDType weights = kiln::models::ModelOptions::WeightDType::f32);

// "1,2,3" (commas and/or spaces) -> ids; `what` names the option in errors.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);

// The text of a file; `cmd` names the subcommand in errors.
std::string read_text(const std::string& path, const std::string& cmd);

}  // namespace lm
