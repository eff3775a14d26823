// A model file mapped into memory privately (copy-on-write): pages are read from
// the file when first touched, a write gives the process its own copy of that
// page, and the file itself never changes. The loaders point parameters into it
// (host backends only), so weights are not read into a second copy.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/backend.h"

namespace kiln::models::detail {

class MappedFile {
 public:
  // Maps the whole of `path`, which must hold at least `min_size` bytes (what
  // its header describes): a shorter file is a kiln::Error naming it, before
  // anything is mapped, so no read can run past the end (SIGBUS).
  MappedFile(const std::string& path, uint64_t min_size);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::string path_;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// The files of one load, mapped on first use, and the buffers over them that the
// model keeps (CausalLM::keep_buffer).
class MappedFiles {
 public:
  // Places `param` (contiguous, no memory yet) at byte `offset` of `path`'s
  // mapping; false (nothing changed) when the bytes there are not aligned to its
  // element size. `file_size` is what the file's header describes.
  bool place(Tensor param, const std::string& path, uint64_t file_size, uint64_t offset);
  // Hands the buffers of the mapped files to `keep` (one per file).
  template <class Keep>
  void hand_over(Keep&& keep) {
    for (auto& [path, buf] : buffers_) keep(std::move(buf));
    buffers_.clear();
  }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Buffer>>> buffers_;
};

// Whether the loaders may map for `backend`: its memory is host memory and the
// machine is little-endian (the byte order of both file formats).
bool can_map(Backend& backend);

}  // namespace kiln::models::detail
