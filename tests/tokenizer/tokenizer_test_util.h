// Shared by the tokenizer tests: where the fetched tokenizers and the SOTU
// corpus are (scripts/get-tokenizers.sh, scripts/get-sotu.sh; ctest runs them
// first as the tokenizer_data fixture), and the committed reference ids.
#pragma once
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace kiln_test {

inline std::string source_dir() { return KILN_SOURCE_DIR; }

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// data/tokenizers/<name>; fails the test (not skips) when it was not fetched.
inline std::string tokenizer_dir(const std::string& name) {
  std::string dir = source_dir() + "/data/tokenizers/" + name;
  if (!std::filesystem::exists(dir + "/tokenizer.json"))
    ADD_FAILURE() << dir << "/tokenizer.json is missing: run bash scripts/get-tokenizers.sh";
  return dir;
}

inline nlohmann::json expected(const std::string& name) {
  return nlohmann::json::parse(
      read_bytes(source_dir() + "/tests/tokenizer/expected/" + name + ".json"));
}

inline std::string text(const std::string& file) {
  return read_bytes(source_dir() + "/tests/tokenizer/texts/" + file);
}

// The SOTU corpus: every *.txt in byte order of names, one document each.
inline std::vector<std::string> sotu_docs() {
  std::string dir = source_dir() + "/data/sotu";
  std::vector<std::string> names;
  if (std::filesystem::is_directory(dir))
    for (const auto& e : std::filesystem::directory_iterator(dir))
      if (e.path().extension() == ".txt") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::string> docs;
  for (const auto& n : names) docs.push_back(read_bytes(dir + "/" + n));
  return docs;
}

inline uint64_t fnv1a64(const std::vector<int32_t>& ids, uint64_t h = 0xcbf29ce484222325ull) {
  for (int32_t id : ids)
    for (int k = 0; k < 4; ++k) h = (h ^ ((uint32_t(id) >> (8 * k)) & 0xff)) * 0x100000001b3ull;
  return h;
}

inline const std::vector<std::string>& tokenizer_names() {
  static const std::vector<std::string> names = {"llama3", "qwen3", "llama2",
                                                 "gpt2",   "gpt4o", "mistral_nemo"};
  return names;
}

}  // namespace kiln_test
