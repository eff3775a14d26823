// safetensors files (https://github.com/huggingface/safetensors): the weight
// format PyTorch (safetensors.torch.save_file), JAX, MLX and the Hugging Face
// hub exchange.
//
//   std::vector<kiln::NamedTensor> sd = {{"fc1.weight", w1}, {"fc1.bias", b1}};
//   kiln::save_safetensors("model.safetensors", sd, {{"format", "pt"}});  // atomic
//   kiln::SafetensorsFile f("model.safetensors");  // parses and validates the header
//   f.read("fc1.weight", w1);                      // dtype and shape must match
//   kiln::load_safetensors("model.safetensors", sd);  // all or nothing
//
// The layout, exactly as the spec has it: an 8-byte little-endian u64 N, then N
// bytes of UTF-8 JSON (it starts with '{'; writers pad it with spaces), then the
// data section. The JSON maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end]} (byte offsets into the data section); the
// optional "__metadata__" entry is a string -> string map.
//
// Every dtype of the spec is read (BOOL, U8, I8, I16, U16, F16, BF16, I32, U32,
// F32, F64, I64, U64, C64, F8_E4M3, F8_E5M2, F8_E8M0, F4, F6_E2M3, F6_E3M2): the
// header parses and read_bytes() returns the raw data. kiln tensors are f32, f16,
// bf16 and i32, so read() loads F32, F16, BF16 and I32 tensors (of at most 4
// dims); for the others it throws "dtype F64 is not supported by kiln". The
// writer writes kiln's four dtypes.
//
// The reader validates before it allocates: a header length over
// kSafetensorsMaxHeader (100 MB, as the reference implementation) or past the end
// of the file, JSON that does not parse, nests deeper than the format does or
// repeats a key, an unknown dtype or field, offsets outside the data section,
// data that is not contiguous (tensors back to back from 0, no gaps, no overlap,
// covering the whole data section), a byte range that is not shape x dtype size,
// and sizes that overflow 64 bits are all kiln::Error("[safetensors] <file>: ...").
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/state_dict.h"

namespace kiln {

inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

class SafetensorsFile : public StateDictReader {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile() override;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const override { return path_; }
  // In the order of the JSON header.
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  const TensorInfo* find(const std::string& name) const override;
  const std::map<std::string, std::string>& metadata() const override { return metadata_; }
  void check(const std::string& name, Tensor dst) const override;
  void read(const std::string& name, Tensor dst) const override;
  std::vector<uint8_t> read_bytes(const std::string& name) const override;

  uint64_t header_size() const { return header_size_; }  // N, padding included
  uint64_t data_offset() const { return 8 + header_size_; }
  // Byte range of a tensor's data within the data section (data_offsets).
  std::pair<uint64_t, uint64_t> data_offsets(const std::string& name) const;

 private:
  const TensorInfo& info(const std::string& name) const;
  std::string path_;
  int fd_ = -1;
  uint64_t header_size_ = 0;
  std::vector<TensorInfo> tensors_;
  std::vector<uint64_t> begin_;  // data_offsets[0] of tensors_[i]
  std::unordered_map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (f32, f16, bf16, i32, each with memory; unique non-empty
// names) and `metadata` as a safetensors file, atomically. The header lists
// "__metadata__" (when not empty) and then the tensors in the given order, their
// data back to back in that order; it is padded with spaces to a multiple of 8
// bytes, as the reference implementation does.
void save_safetensors(const std::string& path, std::span<const NamedTensor> tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Loads the named tensors from `path`, all or nothing: every one is checked
// (present, dtype, shape, memory) before any is written. Tensors of the file
// that are not asked for are ignored; their names are returned.
std::vector<std::string> load_safetensors(const std::string& path,
                                          std::span<const NamedTensor> tensors);

}  // namespace kiln
