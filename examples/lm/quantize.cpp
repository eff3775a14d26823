// kiln-lm quantize: a model (Hugging Face directory or GGUF file) into a GGUF
// file with quantized weights, by one of llama.cpp's recipes (--type q4_k_m,
// q6_k, q8_0, ...: models::quant_recipe_names(); llama-quantize's per-tensor
// choices: the head and a tied embedding at more bits, attn_v / ffn_down more in
// some layers, 32-value fallbacks for rows that are not whole blocks of 256), or
// with every Linear weight and the token embedding of one block type (--pure, or
// a block type that is no recipe: q3_k, q4_k, q5_k; matrices whose rows are not
// whole blocks stay f32). Values are quantized with ggml's reference formulas
// (llama.cpp's bytes for the same values); norms, biases and GPT-2's position
// embedding stay f32. The summary counts the file's tensors by type and names
// the types of token_embd and output. --type f32 quantizes nothing: the model
// as an f32 GGUF file (llama.cpp's convert_hf_to_gguf.py --outtype f32), the
// base llama.cpp applies a GGUF LoRA adapter to.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>

#include "commands.h"
#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/models.h"
#include "lm_model.h"

namespace lm {

namespace {

struct QuantizeOptions {
  std::string in, out, type;
  bool pure = false;
  int threads = 0;
};

// "14 q4_k, 3 q6_k, 9 f32" and the dtypes of token_embd and output, read back
// from the file as written.
std::string file_summary(const std::string& path) {
  const kiln::GgufFile f(path);
  std::map<std::string, int> count;
  std::string embd;
  for (const kiln::GgufTensorInfo& t : f.tensors()) {
    count[kiln::dtype_name(t.dtype)]++;
    if (t.name == "token_embd.weight" || t.name == "output.weight")
      embd += std::string(embd.empty() ? "" : ", ") + t.name + " " + kiln::dtype_name(t.dtype);
  }
  std::string s;
  for (const auto& [type, n] : count) s += (s.empty() ? "" : ", ") + std::to_string(n) + " " + type;
  return s + " (" + embd + ")";
}

int run(const QuantizeOptions& o) {
  namespace fs = std::filesystem;
  const bool recipe = !o.pure && kiln::models::is_quant_recipe(o.type);
  if (recipe) {
    // The params as the file has them (blocks kept), quantized by save_gguf.
    std::unique_ptr<LoadedModel> m = load_model(o.in, o.threads);
    kiln::models::save_gguf(*m->model, o.out, m->tokenizer ? &*m->tokenizer : nullptr, o.type);
    std::printf("recipe %s: %s; %s: %.2f MB\n", o.type.c_str(), file_summary(o.out).c_str(),
                o.out.c_str(), double(fs::file_size(o.out)) / 1e6);
    return 0;
  }
  if (o.type == "f32") {
    std::unique_ptr<LoadedModel> m =
        load_model(o.in, o.threads, 0, "", kiln::models::ModelOptions::WeightDType::f32);
    kiln::models::save_gguf(*m->model, o.out, m->tokenizer ? &*m->tokenizer : nullptr);
    std::printf("f32: %s; %s: %.2f MB\n", file_summary(o.out).c_str(), o.out.c_str(),
                double(fs::file_size(o.out)) / 1e6);
    return 0;
  }
  // One block type: --type is a recipe or a block type (checked by the parser);
  // a recipe's name with --pure is its base type.
  const std::string block = kiln::models::is_quant_recipe(o.type)
                                ? kiln::dtype_name(kiln::models::quant_recipe_base_type(o.type))
                                : o.type;
  const std::optional<kiln::models::ModelOptions::WeightDType> wd =
      kiln::models::quantized_weight_dtype_named(block);
  if (!wd) kiln::fail("quantize", "--type ", o.type, " is not a block type");
  std::unique_ptr<LoadedModel> m = load_model(o.in, o.threads, 0, "", *wd);
  int64_t quantized = 0, kept = 0;
  for (const auto& [name, t] : m->model->named_base_parameters())
    (kiln::is_quantized(t.dtype()) ? quantized : kept)++;
  kiln::models::save_gguf(*m->model, o.out, m->tokenizer ? &*m->tokenizer : nullptr);
  std::printf("quantized %lld matrices to %s, kept %lld tensors f32; %s; %s: %.2f MB\n",
              static_cast<long long>(quantized), block.c_str(), static_cast<long long>(kept),
              file_summary(o.out).c_str(), o.out.c_str(), double(fs::file_size(o.out)) / 1e6);
  return 0;
}

}  // namespace

Command add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* s = app.add_subcommand(
      "quantize",
      "write a GGUF file with quantized weights (llama.cpp's recipes and block formats)");
  s->add_option("in", o->in, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("out", o->out, "the .gguf file to write")->required();
  std::vector<std::string> names = kiln::models::quant_recipe_names();
  std::string recipes, blocks;
  for (const std::string& n : names) recipes += (recipes.empty() ? "" : ", ") + n;
  for (const std::string& n : kiln::models::quantized_weight_dtype_names())
    if (!kiln::models::is_quant_recipe(n)) {
      blocks += (blocks.empty() ? "" : ", ") + n;
      names.push_back(n);
    }
  names.push_back("f32");
  s->add_option("--type", o->type,
                "llama.cpp's recipe: " + recipes +
                    " (llama-quantize's per-tensor types); or one block type for every "
                    "matrix: " +
                    blocks +
                    "; or f32: no quantization, the model as an f32 GGUF file (quantized "
                    "GGUF inputs stay as stored)")
      ->required()
      ->check(CLI::IsMember(names));
  s->add_flag("--pure", o->pure,
              "every Linear weight and the token embedding in the recipe's base type (as "
              "llama-quantize --pure; rows that are not whole blocks stay f32)");
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
