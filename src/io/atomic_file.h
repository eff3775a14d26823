// Atomic file replacement shared by the GGUF and safetensors writers.
//
//   io::AtomicFile out("model.gguf", "gguf");  // removes stale temps, creates the temp file
//   out.write(header.data(), header.size());   // buffered; errors throw kiln::Error
//   out.commit();                              // flush, fsync, close, rename, fsync the dir
//
// The temporary file lives next to the target (same file system, so the rename
// is atomic) and is named `<target>.tmp-<host>-<pid>-XXXXXX`. If the object is
// destroyed before commit() (an exception, a failed write), the temporary file is
// removed and the target is untouched. If the process is killed, the temporary
// file stays; the next save of the same target removes it (see
// remove_stale_temp_files).
#pragma once
#include <cstddef>
#include <cstdio>
#include <string>

namespace kiln::io {

class AtomicFile {
 public:
  // `component` starts every error message ("[gguf] <target>: ...").
  AtomicFile(const std::string& target, const char* component);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  const std::string& temp_path() const { return temp_; }
  void write(const void* data, size_t n);
  void write_zeros(size_t n);
  // Makes the new contents durable and visible under the target's name.
  void commit();

 private:
  [[noreturn]] void fail_io(const char* what) const;
  std::string target_, temp_;
  const char* component_;
  std::FILE* file_ = nullptr;
  int fd_ = -1;
  bool committed_ = false;
};

// Removes temporary files that earlier saves of `target` left behind when they
// were killed, and returns how many it removed. Only files in the target's
// directory named `<target basename>.tmp-...` by an AtomicFile, regular files
// owned by this user, are considered, and of those only stale ones:
//  - written on this host (the host name is in the file name) by a process
//    that no longer exists (its pid is in the file name), or
//  - not modified for kStaleTempAge (files of other hosts, of pids that were
//    reused, and the `<target>.tmp-XXXXXX` files of kiln versions before the
//    pid was in the name).
// A save in progress in a live process (this one included) is never touched.
inline constexpr int kStaleTempAgeSeconds = 24 * 3600;
size_t remove_stale_temp_files(const std::string& target);

// The host-name part of temporary file names (letters, digits, '_' and '.';
// at most 32 bytes).
std::string temp_host_tag();

}  // namespace kiln::io
