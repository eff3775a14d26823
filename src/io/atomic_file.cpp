// AtomicFile: temp file + fsync + rename, and the removal of temp files that
// killed saves left behind.
#include "io/atomic_file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <vector>

#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::io {

namespace {

std::string errno_text() { return std::strerror(errno); }

struct SplitPath {
  std::string dir;  // "." when the path has no slash
  std::string base;
};

SplitPath split(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

// Mode for the new file: the old file's mode when there is one, else rw-r--r--
// (mkstemp creates 0600, which would make a saved model unreadable to others).
mode_t target_mode(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return st.st_mode & 07777;
  return 0644;
}

void sync_dir(const std::string& dir) {
  int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;  // best effort: the rename itself already happened
  ::fsync(fd);
  ::close(fd);
}

bool all_alnum(std::string_view s) {
  for (char c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) return false;
  return true;
}

bool all_digits(std::string_view s) {
  if (s.empty() || s.size() > 9) return false;  // pids are < 2^22 on Linux
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// What a temporary file name (the part after "<target>.tmp-") says about its writer.
struct TempName {
  bool ours = false;     // an AtomicFile name at all
  bool has_pid = false;  // current format: host and pid known
  std::string host;
  long pid = 0;
};

TempName parse_temp_suffix(std::string_view rest) {
  TempName t;
  // Legacy: exactly the six characters mkstemp chose.
  if (rest.size() == 6 && all_alnum(rest)) {
    t.ours = true;
    return t;
  }
  // Current: <host>-<pid>-XXXXXX.
  if (rest.size() < 10 || rest[rest.size() - 7] != '-' || !all_alnum(rest.substr(rest.size() - 6)))
    return t;
  std::string_view head = rest.substr(0, rest.size() - 7);  // <host>-<pid>
  const size_t dash = head.find_last_of('-');
  if (dash == std::string_view::npos || dash == 0 || !all_digits(head.substr(dash + 1))) return t;
  t.ours = true;
  t.has_pid = true;
  t.host = std::string(head.substr(0, dash));
  t.pid = std::stol(std::string(head.substr(dash + 1)));
  return t;
}

bool process_gone(long pid) {
  if (pid <= 0) return false;
  return ::kill(pid_t(pid), 0) != 0 && errno == ESRCH;  // EPERM: alive, someone else's
}

}  // namespace

std::string temp_host_tag() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "host";
  std::string out;
  for (const char* p = buf; *p && out.size() < 32; ++p) {
    const unsigned char c = static_cast<unsigned char>(*p);
    out += (std::isalnum(c) || c == '.' || c == '_') ? char(c) : '_';
  }
  return out.empty() ? "host" : out;
}

size_t remove_stale_temp_files(const std::string& target) {
  const SplitPath sp = split(target);
  const std::string prefix = sp.base + ".tmp-";
  DIR* d = ::opendir(sp.dir.c_str());
  if (!d) return 0;  // the save itself will report an unusable directory
  std::vector<std::string> stale;
  const std::string host = temp_host_tag();
  const time_t now = std::time(nullptr);
  const uid_t me = ::geteuid();
  while (const dirent* e = ::readdir(d)) {
    const std::string_view name = e->d_name;
    if (name.size() <= prefix.size() || name.substr(0, prefix.size()) != prefix) continue;
    const TempName t = parse_temp_suffix(name.substr(prefix.size()));
    if (!t.ours) continue;
    const std::string path = sp.dir + "/" + std::string(name);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != me) continue;
    const bool old = now - st.st_mtime > kStaleTempAgeSeconds;
    const bool dead_writer = t.has_pid && t.host == host && process_gone(t.pid);
    if (old || dead_writer) stale.push_back(path);
  }
  ::closedir(d);
  size_t removed = 0;
  for (const std::string& p : stale)
    if (::unlink(p.c_str()) == 0) ++removed;
  return removed;
}

AtomicFile::AtomicFile(const std::string& target, const char* component)
    : target_(target), component_(component) {
  remove_stale_temp_files(target);
  temp_ = target + ".tmp-" + temp_host_tag() + "-" + std::to_string(::getpid()) + "-XXXXXX";
  fd_ = ::mkostemp(temp_.data(), O_CLOEXEC);
  if (fd_ < 0)
    fail(component_, target_, ": cannot create the temporary file ", temp_, ": ", errno_text());
  if (::fchmod(fd_, target_mode(target_)) != 0) {
    const std::string err = errno_text();
    ::close(fd_);
    ::unlink(temp_.c_str());
    fail(component_, target_, ": cannot set the mode of ", temp_, ": ", err);
  }
  file_ = ::fdopen(fd_, "wb");
  if (!file_) {
    const std::string err = errno_text();
    ::close(fd_);
    ::unlink(temp_.c_str());
    fail(component_, target_, ": cannot write ", temp_, ": ", err);
  }
}

AtomicFile::~AtomicFile() {
  if (file_) std::fclose(file_);
  if (!committed_) ::unlink(temp_.c_str());
}

void AtomicFile::fail_io(const char* what) const {
  fail(component_, target_, ": cannot ", what, " ", temp_, ": ", errno_text());
}

void AtomicFile::write(const void* data, size_t n) {
  if (n && std::fwrite(data, 1, n, file_) != n) fail_io("write");
}

void AtomicFile::write_zeros(size_t n) {
  static const char zeros[4096] = {};
  while (n > 0) {
    const size_t k = n < sizeof(zeros) ? n : sizeof(zeros);
    write(zeros, k);
    n -= k;
  }
}

void AtomicFile::commit() {
  if (std::fflush(file_) != 0 || ::fsync(fd_) != 0) fail_io("write");
  std::FILE* f = file_;
  file_ = nullptr;
  if (std::fclose(f) != 0) fail_io("write");
  if (std::rename(temp_.c_str(), target_.c_str()) != 0)
    fail(component_, target_, ": cannot rename ", temp_, " to it: ", errno_text());
  committed_ = true;
  sync_dir(split(target_).dir);
}

}  // namespace kiln::io
