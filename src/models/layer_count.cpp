#include "models/layer_count.h"

#include <unordered_set>

#include "kiln/error.h"

namespace kiln::models::detail {
namespace {

// The layer index `name` names after `prefix` ("12" of "model.layers.12.mlp..."),
// or -1: not such a name, or an index of more than 18 digits or with leading zeros.
int64_t layer_index(std::string_view name, std::string_view prefix) {
  if (name.substr(0, prefix.size()) != prefix) return -1;
  const std::string_view rest = name.substr(prefix.size());
  const size_t dot = rest.find('.');
  if (dot == 0 || dot == std::string_view::npos || dot > 18) return -1;
  if (rest[0] == '0' && dot > 1) return -1;
  int64_t i = 0;
  for (size_t k = 0; k < dot; ++k) {
    if (rest[k] < '0' || rest[k] > '9') return -1;
    i = i * 10 + (rest[k] - '0');
  }
  return i;
}

}  // namespace

void check_layers_present(const LayerNames& files, int64_t layers, const std::string& holder,
                          const std::string& what) {
  // Indices present, of which only those below `layers` matter; the first
  // missing one is found in at most (distinct indices + 1) steps, whatever
  // `layers` says.
  std::unordered_set<int64_t> present;
  for (std::string_view n : files.names)
    for (const std::string& p : files.prefixes)
      if (const int64_t i = layer_index(n, p); i >= 0 && i < layers) present.insert(i);
  int64_t missing = 0;
  while (missing < layers && present.count(missing)) ++missing;
  if (missing == layers) return;
  fail("models", holder, ": holds no tensor of layer ", missing, " ('", files.prefixes.at(0),
       missing, ".*'), yet ", what, " is ", layers, " (the files hold ", int64_t(present.size()),
       " of those layers)");
}

}  // namespace kiln::models::detail
