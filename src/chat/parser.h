// Tokens → statements. Jinja's grammar and operator precedence for the tags
// chat templates use; any other tag (extends, include, import, call, filter,
// ...) is a kiln::Error naming it and its line.
#pragma once
#include <string>
#include <vector>

#include "chat/ast.h"
#include "chat/lexer.h"

namespace kiln::chat {

Body parse(const std::vector<Token>& tokens, const std::string& name);

}  // namespace kiln::chat
