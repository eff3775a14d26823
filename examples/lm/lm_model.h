// What kiln-lm's model subcommands share: loading a model (a Hugging Face
// directory or a .gguf file) with its tokenizer when it has one and an
// optional LoRA adapter, reading token ids from the command line, and what
// pretrain and finetune share (documents as ids, tokenizer files, peak RSS).
#pragma once
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

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

// `max_seq_len` 0: the model's default (ModelOptions::max_seq_len). `adapter`:
// a PEFT LoRA adapter directory or a GGUF adapter file (kiln-lm finetune's
// --out, or llama.cpp's convert_lora_to_gguf.py's) loaded onto the model
// and merged into its weights; empty: none. `weights`: ModelOptions::weight_dtype;
// a GGUF file with Q8_0/Q4_0 tensors keeps them quantized unless `weights` asks
// for another quantized type.
std::unique_ptr<LoadedModel> load_model(
    const std::string& path, int threads, int64_t max_seq_len = 0, const std::string& adapter = "",
    kiln::models::ModelOptions::WeightDType weights = kiln::models::ModelOptions::WeightDType::f32);

// --precision of generate and perplexity: "bf16" loads the matrices as bf16
// (WeightDType::bf16: half the memory and bytes per token) and runs the
// products on bf16 operands with f32 accumulation (Context::set_matmul_precision);
// "f32" (the default) changes nothing. A quantized GGUF stays quantized.
std::unique_ptr<LoadedModel> load_model_with_precision(const std::string& path, int threads,
                                                       int64_t max_seq_len,
                                                       const std::string& adapter,
                                                       const std::string& precision);

// Adds --precision f32|bf16 (load_model_with_precision) to an inference subcommand.
void add_precision_option(CLI::App* app, std::string& precision);

// "1,2,3" (commas and/or spaces) -> ids; `what` names the option in errors.
std::vector<int32_t> parse_ids(const std::string& text, const std::string& what);

// The text of a file; `cmd` names the subcommand in errors.
std::string read_text(const std::string& path, const std::string& cmd);

// Documents as one stream of ids, each "BOS text EOS" (the ids the tokenizer
// has of the two): the layout pretrain trains on and finetune continues with.
std::vector<uint32_t> document_ids(const kiln::Tokenizer& tok, const std::vector<std::string>& docs,
                                   int threads);

// Whether the GGUF file `gguf` stores any tensor in a quantized block type.
bool has_quantized_tensors(const std::string& gguf);

// Whether `path` is a GGUF file (its first bytes are GGUF's magic).
bool is_gguf_file(const std::string& path);

// The tokenizer of `path`: a directory's tokenizer.json, a tokenizer.json
// file, or a GGUF file's tokenizer.ggml.* vocabulary.
kiln::Tokenizer load_tokenizer(const std::string& path);

// Copies the tokenizer of `path` (a directory's tokenizer.json, or the file
// itself, saved as tokenizer.json) and the tokenizer_config.json beside it when
// there is one into `out_dir`: what a saved model directory needs to be loaded
// with its tokenizer.
void copy_tokenizer_files(const std::string& path, const std::filesystem::path& out_dir);

// The peak resident set size of this process so far, in MB (getrusage).
double peak_rss_mb();

}  // namespace lm
