// The loaders' first check, before any module is built: every layer the config
// (or GGUF metadata) asks for has tensors in the files. Building a model costs
// time and memory per layer before its tensors are matched, so a config whose
// layer count disagrees with the files (a hostile num_hidden_layers: 100000)
// must fail here, in time linear in the files' tensors, not after building it.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::models::detail {

// A source of tensor names the check walks (the files' names, once each).
struct LayerNames {
  std::vector<std::string_view> names;
  // Names of layer i start with prefix + i + "." for one of these prefixes
  // ("model.layers.", "h.", "blk.").
  std::vector<std::string> prefixes;
};

// Throws kiln::Error "[models] <holder>: holds no tensor of layer i ('<prefix>i.*'),
// yet <what> is <layers> ..." naming the first layer in 0 .. layers-1 without
// a tensor. `holder` is the file (or index) the names come from, `what` the
// field or key that set the count ("config.json field 'num_hidden_layers'").
void check_layers_present(const LayerNames& files, int64_t layers, const std::string& holder,
                          const std::string& what);

}  // namespace kiln::models::detail
