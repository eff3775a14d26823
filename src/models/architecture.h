// One place per architecture: what the loaders, writers and builders of
// src/models ask of an architecture, answered by its row of
// src/models/architectures.def and its file src/models/<name>_arch.cpp.
// Nothing outside an architecture's files branches on which architecture a
// config is; it looks the answer up here (docs/adding-a-model.md).
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/io.h"
#include "kiln/models.h"
#include "models/gguf_layout.h"
#include "models/json_fields.h"

namespace kiln::models::detail {

// Metadata of one GGUF file under "<arch>.", each key marked when read so that
// unknown ones of the architecture's namespace can be reported.
class GgufMeta {
 public:
  GgufMeta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const GgufFile& file() const { return f_; }
  const std::string& arch() const { return arch_; }
  const GgufValue* find(const std::string& key);
  // > 0, required / with a fallback when absent.
  int64_t integer(const std::string& key);
  int64_t integer(const std::string& key, int64_t fallback);
  double number(const std::string& key, double fallback);
  // Throws naming the first "<arch>.*" key nobody read.
  void reject_unread() const;
  [[noreturn]] void fail_key(const std::string& key, const std::string& why) const;

 private:
  const GgufFile& f_;
  std::string arch_;
  std::set<std::string> read_;
};

// An architecture's answers (set by arch_<name>() in <name>_arch.cpp).
struct ArchHooks {
  // config.json: the architecture's fields into cfg (cfg.model_type is set;
  // the fields every config has are read already). Unread fields are errors.
  void (*read_config)(Fields& f, ModelConfig& cfg);
  // config.json's fields of cfg (model_type and token ids are written by the caller).
  void (*write_config)(const ModelConfig& cfg, Json& j);
  // GGUF: general.architecture of a config; its metadata (and any
  // non-parameter tensors, such as rope_freqs) into cfg; and back.
  std::string (*gguf_arch)(const ModelConfig& cfg);
  void (*read_gguf)(GgufMeta& m, ModelConfig& cfg);
  void (*write_gguf)(const ModelConfig& cfg, GgufWriter& w, const std::string& path);
  // Tensors a GGUF file may hold besides the parameters' (read by read_gguf, or
  // duplicates llama.cpp's converter writes).
  std::vector<std::string> gguf_extra_tensors;
  // The tied token table goes in a second time as output.weight (GPT-2: as
  // llama.cpp's converter writes it).
  bool gguf_writes_tied_output = false;
  // HF parameter name -> llama.cpp tensor name; "" when it has none.
  std::string (*gguf_name)(const std::string& hf);
  // How a tensor's rows differ between kiln (HF layout) and the GGUF file.
  Layout (*layout_of)(const std::string& hf, const ModelConfig& cfg, int64_t* heads);
  // Layer count, the config field that sets it, the HF prefixes of a layer's
  // tensors ("model.layers."; layer i's names go on with "i.").
  int64_t (*layers)(const ModelConfig& cfg);
  const char* layer_field;
  std::vector<std::string> layer_prefixes;
  // llama.cpp's quantization recipes' view of the model.
  RecipeModel (*recipe_model)(const ModelConfig& cfg);
  // The token embedding's parameter name; whether the head is that table.
  const char* embedding;
  bool (*tied_head)(const ModelConfig& cfg);
  std::unique_ptr<CausalLM> (*make)(Context& ctx, const ModelConfig& cfg, const ModelOptions& opt);
  // config.json's auto_map (custom model code) is accepted when every class it
  // names is in configuration_<m>.py / modeling_<m>.py, m this module: the
  // copy of the architecture's code that transformers has built in. nullptr: refused.
  const char* remote_code_module = nullptr;
};

// A row of architectures.def with its hooks.
struct Architecture {
  const char* name;
  std::vector<std::string> model_types, gguf_archs;
  const ArchHooks* hooks;
  const ArchHooks* operator->() const { return hooks; }
};

#define KILN_ARCH(name, modules, model_types, gguf_archs, fixture) const ArchHooks& arch_##name();
#include "models/architectures.def"
#undef KILN_ARCH

const std::vector<Architecture>& architectures();
// The row accepting a config.json model_type / a GGUF general.architecture;
// nullptr if none does.
const Architecture* architecture_for_model_type(std::string_view model_type);
const Architecture* architecture_for_gguf(std::string_view gguf_arch);
// The row of a built config (by its model_type); an error if none.
const Architecture& architecture_of(const ModelConfig& cfg);
// "llama, mistral, ..." : every row's model types / GGUF architectures (error messages).
std::string supported_model_types();
std::string supported_gguf_archs();

// Shared by the architectures' files.
// Fields whose value must be `needed` (fallback when absent) (config.cpp).
void require_field(Fields& f, const std::string& key, bool fallback, bool needed, const char* why);
// "<arch>.vocab_size", or the rows of token_embd.weight (which must be 2-D).
int64_t gguf_vocab_size(GgufMeta& m);

}  // namespace kiln::models::detail
