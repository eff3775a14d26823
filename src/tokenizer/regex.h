// A PCRE2 pattern (UTF, Unicode properties, JIT-compiled) for the tokenizer's
// Split pre-tokenizers and Replace normalizers/decoders.
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace kiln::tok {

class Regex {
 public:
  // `what` names the component in errors ("[tokenizer] ...: Split pattern ...").
  Regex(const std::string& pattern, const std::string& what);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The first match in s at or after `from`: true and [*begin, *end), or false.
  // `from` must be at a character boundary; s must be valid UTF-8.
  bool find(std::string_view s, size_t from, size_t* begin, size_t* end) const;
  const std::string& pattern() const { return pattern_; }

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// Byte length of the UTF-8 character starting with byte c (1 for invalid lead bytes).
inline size_t utf8_len(unsigned char c) {
  return c < 0xC0 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : c < 0xF8 ? 4 : 1;
}

}  // namespace kiln::tok
