// Renders parsed statements: scopes, control flow, calls and the limits that
// stop a hostile template (steps, macro depth, output size).
#pragma once
#include <string>
#include <unordered_map>
#include <vector>

#include "chat/ast.h"
#include "chat/value.h"
#include "kiln/chat.h"

namespace kiln::chat {

class Evaluator {
 public:
  Evaluator(const std::string& name, const Limits& limits, std::shared_ptr<Object> variables);

  // `generation`, when given, receives the [begin, end) byte ranges of the
  // output that {% generation %} blocks wrote (those inside a {% set %} block's
  // capture are not output and are not marked).
  std::string render(const Body& body,
                     std::vector<std::pair<size_t, size_t>>* generation = nullptr);

  // Evaluates `e`; a big string or list result costs steps in proportion to
  // its size (values are copied), so copying large values in a loop is bounded
  // by Limits::max_steps too, not only the loop's iterations.
  Value eval(const Expr& e);
  Value call(const Value& fn, Args& args, const std::string& what);

  // kiln::Error "[name] line N: what", N the line being evaluated.
  [[noreturn]] void fail(const std::string& what) const;
  // Strings and lists a template builds are bounded like its output.
  void check_size(size_t bytes, const char* what) const;
  const Limits& limits() const { return limits_; }

 private:
  enum class Flow { Normal, Break, Continue };

  Flow exec(const Body& body);
  Flow exec(const Stmt& s);
  Flow exec_for(const Stmt& s);
  void exec_set(const Stmt& s);
  void step(int line);
  Value eval_node(const Expr& e);
  void emit(std::string_view text);

  Value lookup(const std::string& name) const;
  void assign(const std::string& name, Value v);
  Value eval_binary(const Expr& e);
  Value eval_call(const Expr& e);
  Value call_macro(const Stmt& macro, Args& args);
  Args eval_args(const Expr& e, size_t first);

  const std::string& name_;
  const Limits& limits_;
  std::shared_ptr<Object> variables_;
  std::unordered_map<std::string, Value> globals_;  // range, namespace, raise_exception, ...
  // Scopes, innermost last. A macro call sees its own scopes (from base_ up)
  // and the template's top-level scope (0), as Jinja's macros do.
  std::vector<std::unordered_map<std::string, Value>> scopes_;
  size_t base_ = 0;
  std::string* out_ = nullptr;
  std::string* top_out_ = nullptr;  // the render's output (out_ differs while capturing)
  std::vector<std::pair<size_t, size_t>>* generation_ = nullptr;
  uint64_t steps_ = 0;
  int depth_ = 0;
  int line_ = 1;
};

// Filters, tests, methods of str / dict / list and global functions (builtins.cpp).
Value apply_filter(Evaluator& ev, const std::string& name, Value subject, Args& args);
bool apply_test(Evaluator& ev, const std::string& name, const Value& subject, Args& args);
bool has_test(const std::string& name);
Value call_method(Evaluator& ev, const Value& self, const std::string& name, Args& args);
void add_globals(std::unordered_map<std::string, Value>& globals);
// Items a for loop or a filter iterates: a list's items, a dict's keys, a
// string's characters; Undefined and None give none.
Array iterate(Evaluator& ev, const Value& v);

}  // namespace kiln::chat
