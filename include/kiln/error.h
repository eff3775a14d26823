// kiln::Error: the one exception type for bad user input. Messages start with the
// op in brackets and name the tensors and shapes involved, e.g.
//   [matmul] a is [32, 784] but b is [500, 10]
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream os;
  (os << ... << parts);
  return os.str();
}
[[noreturn]] void assert_fail(const char* expr, const char* file, int line);
}  // namespace detail

// Throws kiln::Error("[op] " + parts...).
template <class... Parts>
[[noreturn]] void fail(const char* op, const Parts&... parts) {
  throw Error(detail::concat("[", op, "] ", parts...));
}

}  // namespace kiln

// Library invariants (not user errors): abort with a message.
#define KILN_ASSERT(x) ((x) ? (void)0 : ::kiln::detail::assert_fail(#x, __FILE__, __LINE__))
