// MappedFile: mmap(MAP_PRIVATE, PROT_READ | PROT_WRITE) of a whole file.
#include "models/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <vector>

#include "kiln/ext/tensor_node.h"

namespace kiln::models::detail {

MappedFile::MappedFile(const std::string& path, uint64_t min_size) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("models", path, ": cannot open for mapping (", std::strerror(errno), ")");
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    fail("models", path, ": cannot stat (", std::strerror(e), ")");
  }
  const uint64_t size = uint64_t(st.st_size);
  if (size < min_size) {
    ::close(fd);
    fail("models", path, ": is ", size, " bytes, shorter than the ", min_size,
         " its header describes (truncated or changed while loading)");
  }
  size_ = size_t(size);
  if (size_ > 0) {
    // Private and writable: training updates the mapped params in place, and
    // each written page becomes the process's own copy; the file stays as it is.
    void* p = ::mmap(nullptr, size_, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      fail("models", path, ": cannot map ", size_, " bytes (", std::strerror(e),
           "); ModelOptions::mmap = false copies the weights instead");
    }
    data_ = static_cast<uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

bool MappedFiles::place(Tensor param, const std::string& path, uint64_t file_size,
                        uint64_t offset) {
  TensorNode* n = param.node();
  KILN_ASSERT(!n->data && n->is_contiguous());
  // CPU kernels read elements through typed pointers: each must be aligned.
  // (Quantized blocks are read as an f16 scale and bytes: 2-byte alignment.)
  if (offset % (is_quantized(n->dtype) ? 2 : n->elem_size()) != 0) return false;
  Buffer* buf = nullptr;
  for (auto& [p, b] : buffers_)
    if (p == path) buf = b.get();
  if (!buf) {
    auto file = std::make_shared<MappedFile>(path, file_size);
    void* base = file->data();
    const size_t size = file->size();
    buffers_.emplace_back(path, host_buffer_from_ptr(base, size, std::move(file)));
    buf = buffers_.back().second.get();
  }
  KILN_ASSERT(offset + n->nbytes() <= buf->size());
  n->data = static_cast<uint8_t*>(buf->base()) + offset;
  n->buffer = buf;
  buf->track(n);
  return true;
}

bool can_map(Backend& backend) {
  return std::endian::native == std::endian::little && backend.buffer_type().is_host();
}

}  // namespace kiln::models::detail
