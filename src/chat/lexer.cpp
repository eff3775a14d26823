#include "chat/lexer.h"

#include <cctype>
#include <cstdint>

#include "kiln/error.h"
#include "tokenizer/utf8.h"

namespace kiln::chat {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& name) : src_(src), name_(name) {
    // Jinja drops one trailing newline (keep_trailing_newline=False).
    if (!src_.empty() && src_.back() == '\n') src_.remove_suffix(1);
    if (!src_.empty() && src_.back() == '\r') src_.remove_suffix(1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t tag = find_tag(pos_);
      emit_text(pos_, tag);
      if (tag == src_.size()) break;
      lex_tag(tag);
    }
    tokens_.push_back({Token::Kind::Eof, "", line_at(src_.size())});
    return std::move(tokens_);
  }

 private:
  [[noreturn]] void error(size_t at, const std::string& what) {
    int line = 1;
    for (size_t k = 0; k < at && k < src_.size(); ++k) line += src_[k] == '\n';
    throw Error(detail::concat("[", name_, "] line ", line, ": ", what));
  }

  int line_at(size_t at) {
    // Lines are counted incrementally: positions only move forward.
    while (line_pos_ < at && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  size_t find_tag(size_t from) const {
    for (size_t k = from; k + 1 < src_.size(); ++k)
      if (src_[k] == '{' && (src_[k + 1] == '{' || src_[k + 1] == '%' || src_[k + 1] == '#'))
        return k;
    return src_.size();
  }

  // Text between tags, with what the previous tag asked to strip from its start.
  void emit_text(size_t begin, size_t end) {
    std::string_view text = src_.substr(begin, end - begin);
    if (strip_next_ == Strip::All) {
      while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    } else if (strip_next_ == Strip::Newline) {
      if (text.substr(0, 2) == "\r\n") text.remove_prefix(2);
      else if (!text.empty() && (text[0] == '\n' || text[0] == '\r')) text.remove_prefix(1);
    }
    strip_next_ = Strip::None;
    text_begin_ = begin;
    if (!text.empty()) tokens_.push_back({Token::Kind::Text, std::string(text), line_at(begin)});
    last_text_ = tokens_.size() - (text.empty() ? 0 : 1);
    has_text_ = !text.empty();
  }

  // Applies `{%-` / `{{-` (all whitespace) or lstrip_blocks (spaces and tabs
  // back to a line start) to the text just before a tag at `tag`.
  void strip_before(size_t tag, char kind, char modifier) {
    if (!has_text_) return;
    std::string& text = tokens_[last_text_].text;
    if (modifier == '-') {
      while (!text.empty() && is_space(text.back())) text.pop_back();
    } else if (kind != '{' && modifier != '+') {
      const size_t nl = text.rfind('\n');
      const size_t from = nl == std::string::npos ? 0 : nl + 1;
      const bool line_start =
          nl != std::string::npos || text_begin_ == 0 || src_[text_begin_ - 1] == '\n';
      bool blank = line_start;
      for (size_t k = from; blank && k < text.size(); ++k)
        blank = text[k] == ' ' || text[k] == '\t';
      if (blank) text.resize(from);
    }
    (void)tag;
    if (text.empty()) {
      tokens_.erase(tokens_.begin() + long(last_text_));
      has_text_ = false;
    }
  }

  void lex_tag(size_t tag) {
    const char kind = src_[tag + 1];  // '{', '%' or '#'
    const char modifier = tag + 2 < src_.size() ? src_[tag + 2] : '\0';
    strip_before(tag, kind, modifier);
    size_t p = tag + 2 + ((modifier == '-' || modifier == '+') ? 1 : 0);
    if (kind == '#') {
      const size_t close = src_.find("#}", p);
      if (close == std::string_view::npos) error(tag, "comment {# is never closed with #}");
      strip_next_ = (close > p && src_[close - 1] == '-') ? Strip::All : Strip::Newline;
      pos_ = close + 2;
      return;
    }
    const int line = line_at(tag);
    const bool block = kind == '%';
    tokens_.push_back({block ? Token::Kind::BlockBegin : Token::Kind::VarBegin, "", line});
    const size_t first_token = tokens_.size();
    int depth = 0;  // open brackets: a dict literal's }} does not end {{ ... }}
    const char close_char = block ? '%' : '}';
    while (true) {
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (p >= src_.size())
        error(tag, block ? "tag {% is never closed with %}" : "{{ is never closed with }}");
      const char c = src_[p];
      const bool dash =
          c == '-' && p + 2 < src_.size() && src_[p + 1] == close_char && src_[p + 2] == '}';
      if (depth == 0 && (dash || (c == close_char && p + 1 < src_.size() && src_[p + 1] == '}'))) {
        tokens_.push_back({block ? Token::Kind::BlockEnd : Token::Kind::VarEnd, "", line_at(p)});
        pos_ = p + (dash ? 3 : 2);
        strip_next_ = dash ? Strip::All : block ? Strip::Newline : Strip::None;
        break;
      }
      p = lex_expression_token(p, depth);
    }
    if (block && tokens_.size() == first_token + 2 &&
        tokens_[first_token].kind == Token::Kind::Name && tokens_[first_token].text == "raw")
      lex_raw(tag);
  }

  // {% raw %}...{% endraw %}: the text in between, tags and all.
  void lex_raw(size_t tag) {
    tokens_.resize(tokens_.size() - 3);
    size_t k = pos_;
    while (true) {
      k = src_.find("{%", k);
      if (k == std::string_view::npos) error(tag, "{% raw %} is never closed with {% endraw %}");
      size_t p = k + 2;
      const bool strip_left = p < src_.size() && src_[p] == '-';
      if (strip_left) ++p;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.substr(p, 6) != "endraw") {
        k += 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      const bool dash = src_.substr(p, 3) == "-%}";
      if (!dash && src_.substr(p, 2) != "%}") error(k, "malformed {% endraw %}");
      emit_text(pos_, k);
      if (strip_left && has_text_) {
        std::string& text = tokens_[last_text_].text;
        while (!text.empty() && is_space(text.back())) text.pop_back();
      }
      pos_ = p + (dash ? 3 : 2);
      strip_next_ = dash ? Strip::All : Strip::Newline;
      return;
    }
  }

  size_t lex_expression_token(size_t p, int& depth) {
    const int line = line_at(p);
    const char c = src_[p];
    if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t e = p;
      while (e < src_.size() &&
             (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
      tokens_.push_back({Token::Kind::Name, std::string(src_.substr(p, e - p)), line});
      return e;
    }
    if (std::isdigit(static_cast<unsigned char>(c))) return lex_number(p, line);
    if (c == '\'' || c == '"') return lex_string(p, line);
    static const char* const two[] = {"==", "!=", "<=", ">=", "//", "**"};
    for (const char* op : two)
      if (src_.substr(p, 2) == op) {
        tokens_.push_back({Token::Kind::Op, op, line});
        return p + 2;
      }
    if (std::string_view("+-*/%~|.,:()[]{}<>=").find(c) == std::string_view::npos)
      error(p, detail::concat("unexpected character '", c, "' in a tag"));
    if (c == '(' || c == '[' || c == '{') ++depth;
    if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
    tokens_.push_back({Token::Kind::Op, std::string(1, c), line});
    return p + 1;
  }

  size_t lex_number(size_t p, int line) {
    size_t e = p;
    bool is_float = false;
    auto digits = [&] {
      while (e < src_.size() &&
             (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
        ++e;
    };
    digits();
    if (e + 1 < src_.size() && src_[e] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
      is_float = true;
      ++e;
      digits();
    }
    if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
      size_t x = e + 1;
      if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
      if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
        is_float = true;
        e = x;
        digits();
      }
    }
    std::string text;
    for (char ch : src_.substr(p, e - p))
      if (ch != '_') text += ch;
    tokens_.push_back({is_float ? Token::Kind::Float : Token::Kind::Int, text, line});
    return e;
  }

  size_t lex_string(size_t p, int line) {
    const char quote = src_[p];
    std::string value;
    size_t k = p + 1;
    while (true) {
      if (k >= src_.size()) error(p, "string literal is never closed");
      const char ch = src_[k];
      if (ch == quote) break;
      if (ch != '\\') {
        value += ch;
        ++k;
        continue;
      }
      if (k + 1 >= src_.size()) error(p, "string literal is never closed");
      const char esc = src_[k + 1];
      k += 2;
      switch (esc) {
        case 'n': value += '\n'; break;
        case 't': value += '\t'; break;
        case 'r': value += '\r'; break;
        case 'b': value += '\b'; break;
        case 'f': value += '\f'; break;
        case 'v': value += '\v'; break;
        case '0': value += '\0'; break;
        case '\\': value += '\\'; break;
        case '\'': value += '\''; break;
        case '"': value += '"'; break;
        case '\n': break;  // a backslash at a line end continues the literal
        case 'x':
        case 'u':
        case 'U': {
          const size_t n = esc == 'x' ? 2 : esc == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t j = 0; j < n; ++j, ++k) {
            if (k >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[k])))
              error(p, detail::concat("bad \\", esc, " escape in a string literal"));
            const char h = src_[k];
            cp = cp * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                        ? h - '0'
                                        : (h | 0x20) - 'a' + 10);
          }
          if (cp > 0x10FFFF) error(p, "escape beyond U+10FFFF in a string literal");
          tok::append_utf8(value, char32_t(cp));
          break;
        }
        default:  // Python keeps unknown escapes as written
          value += '\\';
          value += esc;
      }
    }
    tokens_.push_back({Token::Kind::String, std::move(value), line});
    return k + 1;
  }

  enum class Strip { None, Newline, All };
  std::string_view src_;
  const std::string& name_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  size_t line_pos_ = 0;
  int line_ = 1;
  Strip strip_next_ = Strip::None;
  size_t last_text_ = 0;
  size_t text_begin_ = 0;
  bool has_text_ = false;
};

}  // namespace

std::vector<Token> lex(std::string_view source, const std::string& name) {
  return Lexer(source, name).run();
}

}  // namespace kiln::chat
