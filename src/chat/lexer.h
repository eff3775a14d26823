// Template text → tokens. Whitespace control is applied here, as Jinja's
// lexer does with the settings transformers renders with: trim_blocks (the
// newline after a block or comment tag is dropped), lstrip_blocks (spaces and
// tabs before a block tag that starts its line are dropped), `-` on a tag
// (all whitespace on that side is dropped) and no trailing newline.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kiln::chat {

struct Token {
  enum class Kind {
    Text,
    BlockBegin,
    BlockEnd,
    VarBegin,
    VarEnd,
    Name,
    String,
    Int,
    Float,
    Op,
    Eof
  };
  Kind kind;
  std::string text;  // text, name, operator, or the string literal's value
  int line;
};

// Throws kiln::Error "[<name>] line N: ..." on an unterminated tag or string.
std::vector<Token> lex(std::string_view source, const std::string& name);

}  // namespace kiln::chat
