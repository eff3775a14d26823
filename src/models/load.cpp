// kiln::models::load: a model from a path, whichever of kiln's two layouts it has.
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/models.h"

namespace kiln::models {

std::unique_ptr<CausalLM> load(Context& ctx, Backend& backend, const std::string& path,
                               const ModelOptions& opt) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (fs::is_directory(st)) return load_pretrained(ctx, backend, path, opt);
  if (!fs::exists(st))
    fail("models", path, ": no such file or directory (kiln loads a Hugging Face model ",
         "directory or a GGUF file)");
  if (!fs::is_regular_file(st))
    fail("models", path, ": neither a directory nor a regular file (kiln loads a Hugging Face ",
         "model directory or a GGUF file)");
  // The file's first bytes say what it is, whatever its name.
  char magic[4] = {};
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("models", path, ": cannot open");
  in.read(magic, 4);
  if (in.gcount() != 4 || std::memcmp(magic, "GGUF", 4) != 0)
    fail("models", path, ": not a GGUF file (it does not start with 'GGUF'); kiln loads a ",
         "GGUF file or a Hugging Face model directory (config.json and safetensors files)");
  return load_gguf(ctx, backend, path, opt);
}

}  // namespace kiln::models
