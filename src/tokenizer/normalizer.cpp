// Normalizers: Unicode forms through utf8proc, Lowercase, Strip, Prepend,
// Replace and Sequence, with Hugging Face tokenizers' semantics.
#include <utf8proc.h>

#include <cstdlib>

#include "kiln/error.h"
#include "tokenizer/model.h"
#include "tokenizer/utf8.h"

namespace kiln::tok {

namespace {

bool is_ascii(std::string_view s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

std::string unicode_form(std::string s, int options) {
  if (is_ascii(s)) return s;  // ASCII is the same in every normalization form
  utf8proc_uint8_t* out = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                    utf8proc_ssize_t(s.size()), &out, utf8proc_option_t(options));
  if (n < 0) fail("tokenizer", "Unicode normalization failed: ", utf8proc_errmsg(n));
  std::string r(reinterpret_cast<const char*>(out), size_t(n));
  std::free(out);
  return r;
}

std::string replace_all(std::string_view s, const Normalizer& n) {
  std::string out;
  size_t pos = 0;
  if (n.regex) {
    size_t b, e;
    while (pos <= s.size() && n.regex->find(s, pos, &b, &e)) {
      out.append(s.substr(pos, b - pos));
      out += n.text;
      pos = e > b ? e : b + (b < s.size() ? utf8_len(static_cast<unsigned char>(s[b])) : 1);
      if (e == b && b < s.size()) out.append(s.substr(b, pos - b));
    }
    if (pos < s.size()) out.append(s.substr(pos));
    return out;
  }
  if (n.literal.empty()) return std::string(s);
  for (size_t at; (at = s.find(n.literal, pos)) != std::string_view::npos;
       pos = at + n.literal.size()) {
    out.append(s.substr(pos, at - pos));
    out += n.text;
  }
  out.append(s.substr(pos));
  return out;
}

std::string strip(std::string_view s, bool left, bool right) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t i = b;
      if (!is_whitespace(next_char(s, i))) break;
      b = i;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t i = start;
      if (!is_whitespace(next_char(s, i))) break;
      e = start;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::string lowercase(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    unsigned char c = s[i];
    if (c < 0x80) {
      out += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
      ++i;
      continue;
    }
    append_utf8(out, char32_t(utf8proc_tolower(int32_t(next_char(s, i)))));
  }
  return out;
}

}  // namespace

std::string normalize(const Normalizer& n, std::string s) {
  switch (n.kind) {
    case Normalizer::NFC: return unicode_form(std::move(s), UTF8PROC_STABLE | UTF8PROC_COMPOSE);
    case Normalizer::NFD: return unicode_form(std::move(s), UTF8PROC_STABLE | UTF8PROC_DECOMPOSE);
    case Normalizer::NFKC:
      return unicode_form(std::move(s), UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT);
    case Normalizer::NFKD:
      return unicode_form(std::move(s), UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT);
    case Normalizer::Lowercase: return lowercase(s);
    case Normalizer::Strip: return strip(s, n.strip_left, n.strip_right);
    case Normalizer::Prepend: return s.empty() ? s : n.text + s;
    case Normalizer::Replace: return replace_all(s, n);
    case Normalizer::Sequence:
      for (const Normalizer& step : n.steps) s = normalize(step, std::move(s));
      return s;
  }
  return s;
}

}  // namespace kiln::tok
