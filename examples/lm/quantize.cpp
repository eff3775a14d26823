// kiln-lm quantize: a model (Hugging Face directory or GGUF file) into a GGUF
// file whose Linear weights and token embedding (token_embd, which a tied head
// reads too; an untied head is the output Linear) are Q8_0 or Q4_0, quantized
// with ggml's reference formulas (llama.cpp's bytes for the same values); norms,
// biases, GPT-2's position embedding and matrices whose rows are not whole
// 32-value blocks stay f32, as llama.cpp keeps norms and biases. Tensors the
// input stores Q8_0/Q4_0 are kept as they are. The summary names the dtypes the
// file holds for token_embd and output. --type f32 quantizes nothing: the
// model as an f32 GGUF file (llama.cpp's convert_hf_to_gguf.py --outtype f32).
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "kiln/error.h"
#include "kiln/io.h"
#include "kiln/models.h"
#include "lm_model.h"

namespace lm {

namespace {

struct QuantizeOptions {
  std::string in, out, type;
  int threads = 0;
};

int run(const QuantizeOptions& o) {
  namespace fs = std::filesystem;
  // --type is f32 or one of quantized_weight_dtype_names() (checked by the parser).
  const kiln::models::ModelOptions::WeightDType wd =
      o.type == "f32" ? kiln::models::ModelOptions::WeightDType::f32
                      : *kiln::models::quantized_weight_dtype_named(o.type);
  std::unique_ptr<LoadedModel> m = load_model(o.in, o.threads, 0, "", wd);
  int64_t quantized = 0, kept = 0;
  for (const auto& [name, t] : m->model->named_base_parameters())
    (kiln::is_quantized(t.dtype()) ? quantized : kept)++;
  kiln::models::save_gguf(*m->model, o.out, m->tokenizer ? &*m->tokenizer : nullptr);
  std::string embd;  // as written: read back from the file
  const kiln::GgufFile f(o.out);
  for (const char* name : {"token_embd.weight", "output.weight"})
    if (const kiln::GgufTensorInfo* t = f.find_tensor(name))
      embd += std::string(embd.empty() ? "" : ", ") + name + " " + kiln::dtype_name(t->dtype);
  std::printf("quantized %lld matrices to %s, kept %lld tensors f32 (%s); %s: %.2f MB\n",
              static_cast<long long>(quantized), o.type.c_str(), static_cast<long long>(kept),
              embd.c_str(), o.out.c_str(), double(fs::file_size(o.out)) / 1e6);
  return 0;
}

}  // namespace

Command add_quantize(CLI::App& app) {
  auto o = std::make_shared<QuantizeOptions>();
  CLI::App* s =
      app.add_subcommand("quantize",
                         "write a GGUF file with quantized Linear weights and token embedding "
                         "(llama.cpp's block formats)");
  s->add_option("in", o->in, "a Hugging Face model directory or a .gguf file")->required();
  s->add_option("out", o->out, "the .gguf file to write")->required();
  std::string types;
  std::vector<std::string> names = kiln::models::quantized_weight_dtype_names();
  for (const std::string& n : names) types += (types.empty() ? "" : ", ") + n;
  names.push_back("f32");
  s->add_option("--type", o->type,
                "block type: " + types +
                    " (a matrix whose rows are not whole blocks stays f32), or f32: no "
                    "quantization, the model as an f32 GGUF file (quantized GGUF inputs stay "
                    "as stored)")
      ->required()
      ->check(CLI::IsMember(names));
  s->add_option("--threads", o->threads, "CPU threads (default: all cores)")
      ->check(CLI::Range(0, 1024));
  return {s, [o] { return run(*o); }};
}

}  // namespace lm
