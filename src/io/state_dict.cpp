// The format-neutral state-dict API: picks safetensors or GGUF by extension;
// GgufStateDict adapts GgufFile to StateDictReader.
#include "kiln/state_dict.h"

#include <algorithm>
#include <cctype>
#include <unordered_set>

#include "kiln/io.h"
#include "kiln/safetensors.h"

namespace kiln {

namespace {

enum class Format { safetensors, gguf };

bool ends_with_nocase(const std::string& s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return std::equal(suffix.begin(), suffix.end(), s.end() - long(suffix.size()),
                    [](char a, char b) {
                      return std::tolower(static_cast<unsigned char>(a)) ==
                             std::tolower(static_cast<unsigned char>(b));
                    });
}

Format format_of(const std::string& path) {
  if (ends_with_nocase(path, ".safetensors")) return Format::safetensors;
  if (ends_with_nocase(path, ".gguf")) return Format::gguf;
  fail("state_dict", path,
       ": unknown model file extension; kiln reads and writes .safetensors and .gguf");
}

class GgufStateDict final : public StateDictReader {
 public:
  explicit GgufStateDict(const std::string& path) : file_(path) {
    for (const GgufTensorInfo& t : file_.tensors()) {
      TensorInfo info;
      info.name = t.name;
      info.dtype = t.dtype;
      info.shape = t.shape;
      info.file_dtype = t.quantized() ? t.quant : dtype_name(t.dtype);
      info.dims.assign(t.shape.begin(), t.shape.end());
      info.nbytes = t.nbytes;
      tensors_.push_back(std::move(info));
    }
    for (const auto& [key, value] : file_.metadata())
      metadata_[key] = value.type() == GgufType::string ? value.as_string() : value.str();
  }
  const std::string& path() const override { return file_.path(); }
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override {
    const GgufTensorInfo* t = file_.find_tensor(name);
    return t ? &tensors_[size_t(t - file_.tensors().data())] : nullptr;
  }
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  void check(const std::string& name, Tensor dst) const override { file_.check_load(dst, name); }
  void read(const std::string& name, Tensor dst) const override { file_.load(dst, name); }
  std::vector<uint8_t> read_bytes(const std::string& name) const override {
    return file_.read_bytes(name);
  }

 private:
  GgufFile file_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

void save_gguf(const std::string& path, std::span<const NamedTensor> tensors,
               const std::map<std::string, std::string>& metadata) {
  GgufWriter w;
  for (const auto& [key, value] : metadata) w.set(key, value);
  for (const NamedTensor& t : tensors) {
    if (t.name.empty()) fail("gguf", path, ": a tensor of the state dict has an empty name");
    w.add_tensor(t.tensor, t.name);
  }
  w.save(path);
}

}  // namespace

std::unique_ptr<StateDictReader> open_state_dict(const std::string& path) {
  switch (format_of(path)) {
    case Format::safetensors: return std::make_unique<SafetensorsFile>(path);
    case Format::gguf: return std::make_unique<GgufStateDict>(path);
  }
  return nullptr;
}

void save_state_dict(const std::string& path, std::span<const NamedTensor> tensors,
                     const std::map<std::string, std::string>& metadata) {
  switch (format_of(path)) {
    case Format::safetensors: save_safetensors(path, tensors, metadata); return;
    case Format::gguf: save_gguf(path, tensors, metadata); return;
  }
}

namespace {
// Checks every tensor, then reads them: all or nothing.
std::vector<std::string> load_all(const StateDictReader& f, std::span<const NamedTensor> tensors) {
  std::unordered_set<std::string> asked;
  for (const NamedTensor& t : tensors) {
    if (!asked.insert(t.name).second)
      fail("state_dict", f.path(), ": tensor '", t.name, "' is asked for twice");
    f.check(t.name, t.tensor);
  }
  for (const NamedTensor& t : tensors) f.read(t.name, t.tensor);
  std::vector<std::string> unused;
  for (const TensorInfo& t : f.tensors())
    if (!asked.count(t.name)) unused.push_back(t.name);
  return unused;
}
}  // namespace

std::vector<std::string> load_state_dict(const std::string& path,
                                         std::span<const NamedTensor> tensors) {
  return load_all(*open_state_dict(path), tensors);
}

std::vector<std::string> load_safetensors(const std::string& path,
                                          std::span<const NamedTensor> tensors) {
  return load_all(SafetensorsFile(path), tensors);
}

}  // namespace kiln
