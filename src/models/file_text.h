// Small helpers the model loaders share (Hugging Face directories, PEFT
// adapters): a whole file as text, and a shape as "[a, b]" for errors.
#pragma once

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/error.h"

namespace kiln::models {

inline std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("models", path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline std::string dims_str(const std::vector<int64_t>& d) {
  std::string s = "[";
  for (size_t i = 0; i < d.size(); ++i) s += (i ? ", " : "") + std::to_string(d[i]);
  return s + "]";
}

}  // namespace kiln::models
