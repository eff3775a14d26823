// Values of the chat-template language: Python's types as Jinja sees them
// (None, bool, int, float, str, list, dict) plus Undefined and callables.
// Lists and dicts are shared (Python reference semantics); templates cannot
// change them except a namespace() object through `{% set ns.x = ... %}`.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace kiln::chat {

struct Value;
class Evaluator;

using Array = std::vector<Value>;

// A dict in insertion order (as Python's), looked up linearly: template dicts are small.
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  bool is_namespace = false;
  const Value* find(const std::string& key) const;
  void set(const std::string& key, Value v);
};

// Positional and keyword arguments of a call.
struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Value(Evaluator&, Args&)>;

struct Value {
  enum class Kind { Undefined, None, Bool, Int, Float, String, Array, Object, Function };
  Kind kind = Kind::Undefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> array;
  std::shared_ptr<Object> object;
  std::shared_ptr<Function> function;

  static Value none() { return with_kind(Kind::None); }
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value number(double v);
  static Value string(std::string v);
  static Value list(Array items);
  static Value dict(std::shared_ptr<Object> o);
  static Value callable(Function fn);

  bool is_undefined() const { return kind == Kind::Undefined; }
  bool is_none() const { return kind == Kind::None; }
  bool is_string() const { return kind == Kind::String; }
  bool is_array() const { return kind == Kind::Array; }
  bool is_object() const { return kind == Kind::Object; }
  bool is_number() const { return kind == Kind::Int || kind == Kind::Float || kind == Kind::Bool; }
  double as_double() const { return kind == Kind::Float ? f : double(kind == Kind::Bool ? b : i); }

 private:
  static Value with_kind(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

// Python's name of the value's type ("str", "list", ...), for error messages.
const char* type_name(const Value& v);
bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// str(v) as Jinja prints it: None, True, 1.5, ['a', 1], {'k': 'v'}; Undefined is "".
std::string to_str(const Value& v);
// Python's repr(): strings quoted.
std::string repr(const Value& v);
// Python's repr of a float: the shortest text that reads back, 1.0, 1e+16, 1e-05.
std::string float_repr(double d);
// json.dumps(v, ensure_ascii=False, indent=indent) (indent < 0: none), as
// transformers' tojson filter: ", " and ": " separators without indent, "," and
// ": " with it.
std::string to_json(const Value& v, int indent);

// UTF-8 strings by code point, as Python's str counts and slices them.
std::vector<std::string_view> code_points(std::string_view s);

}  // namespace kiln::chat
