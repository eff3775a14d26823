// save_safetensors: the JSON header, padded with spaces to 8 bytes, then each
// tensor's bytes back to back; written atomically (io/atomic_file.h).
#include <unordered_set>

#include <nlohmann/json.hpp>

#include "io/atomic_file.h"
#include "io/io_util.h"
#include "io/safetensors_format.h"
#include "kiln/safetensors.h"

namespace kiln {

void save_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                      const std::map<std::string, std::string>& metadata) {
  using Json = nlohmann::ordered_json;
  // Everything is checked, and the header built, before the temporary file exists.
  // The header is written entry by entry in the tensors' order (one JSON object
  // of thousands of keys would look up each key it inserts: quadratic).
  std::string text = "{";
  auto add = [&](const std::string& key, const Json& value) {
    if (text.size() > 1) text += ',';
    text += Json(key).dump();
    text += ':';
    text += value.dump();
  };
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
  try {  // names and metadata must be valid UTF-8
    if (!metadata.empty()) {
      Json m = Json::object();
      for (const auto& [key, value] : metadata) m[key] = value;
      add(safetensors::kMetadataKey, m);
    }
    for (const NamedTensor& t : tensors) {
      if (t.name.empty()) fail("safetensors", path, ": a tensor has an empty name");
      if (t.name == safetensors::kMetadataKey)
        fail("safetensors", path, ": a tensor cannot be named ", safetensors::kMetadataKey);
      if (!names.insert(t.name).second)
        fail("safetensors", path, ": tensor '", t.name, "' is given twice");
      if (!t.tensor.defined()) fail("safetensors", path, ": tensor '", t.name, "' is undefined");
      if (!t.tensor.has_data())
        fail("safetensors", path, ": tensor '", t.name, "' ", t.tensor.shape().str(),
             " has no data: allocate it (and set its values) before saving");
      if (is_quantized(t.tensor.dtype()))
        fail("safetensors", path, ": tensor '", t.name, "' is ", dtype_name(t.tensor.dtype()),
             ": safetensors has no block-quantized dtypes (save it as .gguf, or dequantize it)");
      const uint64_t nbytes = uint64_t(t.tensor.numel()) * dtype_size(t.tensor.dtype());
      Json shape = Json::array();
      for (int64_t d : t.tensor.shape()) shape.push_back(uint64_t(d));
      Json entry = Json::object();
      entry["dtype"] = std::string(safetensors::name_of(t.tensor.dtype()));
      entry["shape"] = std::move(shape);
      entry["data_offsets"] = Json::array({offset, offset + nbytes});
      add(t.name, entry);
      offset += nbytes;
    }
  } catch (const Json::exception& e) {
    fail("safetensors", path,
         ": cannot write the header (is every name and metadata string UTF-8?): ", e.what());
  }
  text += '}';
  text.append((8 - text.size() % 8) % 8, ' ');
  if (text.size() > kSafetensorsMaxHeader)
    fail("safetensors", path, ": the header would be ", text.size(), " bytes, over the limit of ",
         kSafetensorsMaxHeader, " that readers enforce");

  io::AtomicFile out(path, "safetensors");
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = uint8_t(uint64_t(text.size()) >> (8 * i));  // little-endian
  out.write(len, 8);
  out.write(text.data(), text.size());
  for (const NamedTensor& t : tensors) {
    const std::vector<uint8_t> bytes = io::tensor_bytes(t.tensor);
    out.write(bytes.data(), bytes.size());
  }
  out.commit();
}

}  // namespace kiln
