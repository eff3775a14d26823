// Helpers shared by the io layer's file formats (see io_util.h).
#include "io/io_util.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kiln/backend.h"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::io {

bool pread_all(int fd, void* dst, size_t n, uint64_t offset) {
  auto* p = static_cast<uint8_t*>(dst);
  while (n > 0) {
    ssize_t got = ::pread(fd, p, n, off_t(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= size_t(got);
    offset += uint64_t(got);
  }
  return true;
}

int open_for_reading(const std::string& path, const char* component, uint64_t* size) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail(component, path, ": cannot open: ", std::strerror(errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    fail(component, path, ": cannot stat: ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(component, path, ": not a regular file");
  }
  *size = uint64_t(st.st_size);
  return fd;
}

namespace {
template <class V>
std::vector<uint8_t> as_bytes(const std::vector<V>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(V));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <class V>
void set_from(Tensor t, const std::vector<uint8_t>& bytes) {
  std::vector<V> v(bytes.size() / sizeof(V));
  if (!v.empty()) std::memcpy(v.data(), bytes.data(), v.size() * sizeof(V));
  t.set<V>(v);
}
}  // namespace

std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  switch (t.dtype()) {
    case DType::f32: return as_bytes(t.get<float>());
    case DType::i32: return as_bytes(t.get<int32_t>());
    case DType::f16:
    case DType::bf16: return as_bytes(t.get<uint16_t>());
    default: break;
  }
  if (is_quantized(t.dtype())) return t.get<uint8_t>();
  return {};
}

void set_tensor_bytes(Tensor t, const std::vector<uint8_t>& bytes) {
  switch (t.dtype()) {
    case DType::f32: set_from<float>(t, bytes); break;
    case DType::i32: set_from<int32_t>(t, bytes); break;
    case DType::f16:
    case DType::bf16: set_from<uint16_t>(t, bytes); break;
    default:
      if (is_quantized(t.dtype())) t.set<uint8_t>(bytes);
      break;
  }
}

void* host_data(const Tensor& t) {
  const TensorNode* n = t.node();
  if (!n->data || !n->buffer || !n->buffer->is_host() || !n->is_contiguous()) return nullptr;
  return n->data;
}

}  // namespace kiln::io
