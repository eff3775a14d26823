// llama.cpp's GGUF names and row layouts (models/gguf_layout.h), each
// architecture's from its row (models/architecture.h).
#include "models/gguf_layout.h"

#include "models/architecture.h"

namespace kiln::models::detail {

std::string arch_of(const ModelConfig& c) { return architecture_of(c)->gguf_arch(c); }

std::string gguf_name(const std::string& hf, const ModelConfig& c) {
  return architecture_of(c)->gguf_name(hf);
}

Layout layout_of(const std::string& hf, const ModelConfig& c, int64_t* heads) {
  return architecture_of(c)->layout_of(hf, c, heads);
}

std::string mapped_gguf_name(const std::string& hf, const std::string& layers, const NameMap& top,
                             const NameMap& layer) {
  const size_t dot = hf.rfind('.');
  if (dot == std::string::npos) return "";
  const std::string module = hf.substr(0, dot), suffix = hf.substr(dot);  // ".weight"
  if (module.rfind(layers, 0) == 0) {
    const size_t end = module.find('.', layers.size());
    if (end == std::string::npos) return "";
    const std::string n = module.substr(layers.size(), end - layers.size());
    const auto it = layer.find(module.substr(end + 1));
    return it == layer.end() ? "" : "blk." + n + "." + it->second + suffix;
  }
  const auto it = top.find(module);
  return it == top.end() ? "" : it->second + suffix;
}

}  // namespace kiln::models::detail
