// The parsed template: expressions and statements, each with its line for
// error messages.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "chat/value.h"

namespace kiln::chat {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    Literal,  // value
    Name,     // name
    Attr,     // args[0].name
    Index,    // args[0][args[1]]
    Slice,    // args[0][args[1]:args[2]:args[3]], each bound may be null
    Call,     // args[0](args[1..], kwargs)
    Filter,   // args[0] | name(args[1..], kwargs)
    Test,     // args[0] is [not] name(args[1..])
    Unary,    // name ("-", "+", "not") args[0]
    Binary,   // args[0] name args[1]: arithmetic, comparison, "in", "not in", "~"
    And,
    Or,
    Cond,   // args[0] if args[1] else args[2] (may be null)
    List,   // [args...]
    Tuple,  // (args...)
    Dict,   // {args[0]: args[1], ...}
  };
  Kind kind;
  int line;
  std::string name;
  Value literal;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  bool negated = false;  // Test: "is not"
  int depth = 1;         // of the tree below: the parser bounds it
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    Text,      // text
    Output,    // {{ expr }}
    If,        // branches: (condition or null for else, body)
    For,       // for targets in expr [if filter]: body [else: else_body]
    Set,       // set target = expr
    SetBlock,  // set name: body rendered to a string
    Macro,     // macro name(params): body
    Break,
    Continue,
    Generation,  // {% generation %}: transformers' marker of assistant text; renders body
  };
  Kind kind;
  int line;
  std::string text;  // Text; Macro and SetBlock name
  ExprPtr expr;      // Output, For iterable, Set value
  ExprPtr target;    // Set: Name, Attr (ns.x) or Tuple of names
  ExprPtr filter;    // For: the `if` clause
  std::vector<std::string> loop_vars;
  std::vector<std::pair<ExprPtr, Body>> branches;
  std::vector<std::pair<std::string, ExprPtr>> params;  // Macro: name, default (may be null)
  Body body, else_body;
};

// What kiln/chat.h's Template holds.
struct Program {
  Body body;
  bool has_generation = false;  // a {% generation %} block anywhere (macros included)
};

}  // namespace kiln::chat
