// The table of architectures (architectures.def) and its lookups, and GGUF
// metadata reading shared by the architectures' files.
#include "models/architecture.h"

#include <sstream>

namespace kiln::models::detail {
namespace {

std::vector<std::string> arch_row_words(const char* s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string arch_row_names_joined(bool gguf) {
  std::string out;
  for (const Architecture& a : architectures())
    for (const std::string& t : gguf ? a.gguf_archs : a.model_types)
      out += (out.empty() ? "" : ", ") + t;
  return out;
}

}  // namespace

const std::vector<Architecture>& architectures() {
  static const std::vector<Architecture> rows = {
#define KILN_ARCH(name, modules, model_types, gguf_archs, fixture) \
  {#name, arch_row_words(model_types), arch_row_words(gguf_archs), &arch_##name()},
#include "models/architectures.def"
#undef KILN_ARCH
  };
  return rows;
}

const Architecture* architecture_for_model_type(std::string_view model_type) {
  for (const Architecture& a : architectures())
    for (const std::string& t : a.model_types)
      if (t == model_type) return &a;
  return nullptr;
}

const Architecture* architecture_for_gguf(std::string_view gguf_arch) {
  for (const Architecture& a : architectures())
    for (const std::string& t : a.gguf_archs)
      if (t == gguf_arch) return &a;
  return nullptr;
}

const Architecture& architecture_of(const ModelConfig& cfg) {
  const Architecture* a = architecture_for_model_type(cfg.model_type);
  if (!a)
    fail("models", "the config's model_type '", cfg.model_type, "' is none of kiln's (",
         supported_model_types(), ")");
  return *a;
}

std::string supported_model_types() { return arch_row_names_joined(false); }
std::string supported_gguf_archs() { return arch_row_names_joined(true); }

const GgufValue* GgufMeta::find(const std::string& key) {
  read_.insert(arch_ + "." + key);
  return f_.find(arch_ + "." + key);
}

int64_t GgufMeta::integer(const std::string& key) {
  const GgufValue* v = find(key);
  if (!v) fail_key(key, "is missing");
  const int64_t x = v->as_int();
  if (x <= 0) fail_key(key, "must be > 0");
  return x;
}

int64_t GgufMeta::integer(const std::string& key, int64_t fallback) {
  return find(key) ? integer(key) : fallback;
}

double GgufMeta::number(const std::string& key, double fallback) {
  const GgufValue* v = find(key);
  return v ? v->as_float() : fallback;
}

void GgufMeta::reject_unread() const {
  for (const auto& [key, v] : f_.metadata()) {
    if (key.rfind("general.", 0) == 0 || key.rfind("tokenizer.", 0) == 0) continue;
    if (read_.count(key)) continue;
    fail("models", f_.path(), ": metadata '", key, "' is not supported by kiln's ", arch_,
         " model (kiln does not ignore settings it does not implement)");
  }
}

void GgufMeta::fail_key(const std::string& key, const std::string& why) const {
  fail("models", f_.path(), ": metadata '", arch_, ".", key, "' ", why);
}

int64_t gguf_vocab_size(GgufMeta& m) {
  const GgufTensorInfo* embd = m.file().find_tensor("token_embd.weight");
  if (!embd || embd->shape.ndim() != 2)
    fail("models", m.file().path(), ": tensor 'token_embd.weight' is missing or not 2-D");
  return m.integer("vocab_size", embd->shape[0]);
}

}  // namespace kiln::models::detail
