// Shared by the libFuzzer targets: the readers take a path, so each input is
// written to one in-memory file (memfd) that is opened by its /proc path.
#pragma once
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>

namespace kiln_fuzz {

inline const std::string& input_path(const uint8_t* data, size_t size) {
  static const int fd = ::memfd_create("kiln-fuzz-input", MFD_CLOEXEC);
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (fd < 0 || ::ftruncate(fd, 0) != 0) std::abort();
  size_t done = 0;
  while (done < size) {
    const ssize_t n = ::pwrite(fd, data + done, size - done, off_t(done));
    if (n <= 0) std::abort();
    done += size_t(n);
  }
  return path;
}

}  // namespace kiln_fuzz
