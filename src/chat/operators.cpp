// Binary operators with Python's rules: int arithmetic stays int (overflow is
// an error, not a wrap), `/` is true division, `//` and `%` floor, `+` joins
// strings and lists, `~` joins as strings, `in` looks in strings, lists and
// dict keys.
#include <cmath>

#include "chat/eval.h"
#include "kiln/error.h"

namespace kiln::chat {
namespace {

bool is_int(const Value& v) { return v.kind == Value::Kind::Int || v.kind == Value::Kind::Bool; }
int64_t int_of(const Value& v) { return v.kind == Value::Kind::Bool ? int64_t(v.b) : v.i; }

bool contains(Evaluator& ev, const Value& container, const Value& item) {
  switch (container.kind) {
    case Value::Kind::String:
      if (!item.is_string())
        ev.fail(detail::concat("'in <string>' needs a string, not ", type_name(item)));
      return container.s.find(item.s) != std::string::npos;
    case Value::Kind::Array:
      for (const Value& v : *container.array)
        if (equal(v, item)) return true;
      return false;
    case Value::Kind::Object: return item.is_string() && container.object->find(item.s) != nullptr;
    case Value::Kind::Undefined: return false;  // Jinja's Undefined iterates as empty
    default: ev.fail(detail::concat("argument of type ", type_name(container), " is not iterable"));
  }
}

int compare(Evaluator& ev, const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    if (is_int(a) && is_int(b)) return int_of(a) < int_of(b) ? -1 : int_of(a) > int_of(b);
    const double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y;
  }
  if (a.is_string() && b.is_string())
    return a.s < b.s ? -1 : a.s > b.s;  // UTF-8 bytes sort as code points
  if (a.is_array() && b.is_array()) {
    const size_t n = std::min(a.array->size(), b.array->size());
    for (size_t k = 0; k < n; ++k)
      if (!equal((*a.array)[k], (*b.array)[k]))
        return compare(ev, (*a.array)[k], (*b.array)[k], op);
    return a.array->size() < b.array->size() ? -1 : a.array->size() > b.array->size();
  }
  ev.fail(detail::concat("'", op, "' not supported between ", type_name(a), " and ", type_name(b)));
}

Value repeat(Evaluator& ev, const Value& seq, int64_t times) {
  if (times <= 0) return seq.is_string() ? Value::string("") : Value::list({});
  if (seq.is_string()) {
    ev.check_size(seq.s.size() * size_t(times), "a repeated string");
    std::string out;
    for (int64_t k = 0; k < times; ++k) out += seq.s;
    return Value::string(std::move(out));
  }
  ev.check_size(seq.array->size() * size_t(times), "a repeated list");
  Array out;
  for (int64_t k = 0; k < times; ++k) out.insert(out.end(), seq.array->begin(), seq.array->end());
  return Value::list(std::move(out));
}

Value arithmetic(Evaluator& ev, const std::string& op, const Value& a, const Value& b) {
  if (op == "+") {
    if (a.is_string() && b.is_string()) {
      ev.check_size(a.s.size() + b.s.size(), "a string");
      return Value::string(a.s + b.s);
    }
    if (a.is_array() && b.is_array()) {
      Array out = *a.array;
      out.insert(out.end(), b.array->begin(), b.array->end());
      return Value::list(std::move(out));
    }
  }
  if (op == "*") {
    if ((a.is_string() || a.is_array()) && is_int(b)) return repeat(ev, a, int_of(b));
    if ((b.is_string() || b.is_array()) && is_int(a)) return repeat(ev, b, int_of(a));
  }
  if (!a.is_number() || !b.is_number())
    ev.fail(detail::concat("unsupported operand types for ", op, ": ", type_name(a), " and ",
                           type_name(b)));
  if (is_int(a) && is_int(b) && op != "/") {
    const int64_t x = int_of(a), y = int_of(b);
    int64_t r = 0;
    bool overflow = false;
    if (op == "+") overflow = __builtin_add_overflow(x, y, &r);
    else if (op == "-") overflow = __builtin_sub_overflow(x, y, &r);
    else if (op == "*") overflow = __builtin_mul_overflow(x, y, &r);
    else if (op == "//" || op == "%") {
      if (y == 0) ev.fail("integer division or modulo by zero");
      if (x == INT64_MIN && y == -1) overflow = true;
      else {
        int64_t q = x / y, m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) {
          --q;
          m += y;
        }
        r = op == "//" ? q : m;
      }
    } else if (op == "**") {
      if (y < 0) return Value::number(std::pow(double(x), double(y)));
      r = 1;
      int64_t base = x, e = y;
      while (e > 0 && !overflow) {  // by squaring: 1 ** 10**18 must not take 10**18 steps
        if (e & 1) overflow = __builtin_mul_overflow(r, base, &r);
        e >>= 1;
        if (e && !overflow) overflow = __builtin_mul_overflow(base, base, &base);
      }
    }
    if (overflow) ev.fail(detail::concat("integer overflow in ", x, " ", op, " ", y));
    return Value::integer(r);
  }
  const double x = a.as_double(), y = b.as_double();
  if (op == "+") return Value::number(x + y);
  if (op == "-") return Value::number(x - y);
  if (op == "*") return Value::number(x * y);
  if (op == "**") return Value::number(std::pow(x, y));
  if (y == 0) ev.fail(op == "/" ? "division by zero" : "float modulo or floor division by zero");
  if (op == "/") return Value::number(x / y);
  if (op == "//") return Value::number(std::floor(x / y));
  double m = std::fmod(x, y);
  if (m != 0 && ((m < 0) != (y < 0))) m += y;
  return Value::number(m);
}

}  // namespace

Value Evaluator::eval_binary(const Expr& e) {
  const Value a = eval(*e.args[0]);
  const Value b = eval(*e.args[1]);
  line_ = e.line;
  const std::string& op = e.name;
  if (op == "~") {
    std::string s = to_str(a) + to_str(b);
    check_size(s.size(), "a string");
    return Value::string(std::move(s));
  }
  if (op == "==") return Value::boolean(equal(a, b));
  if (op == "!=") return Value::boolean(!equal(a, b));
  if (op == "in") return Value::boolean(contains(*this, b, a));
  if (op == "not in") return Value::boolean(!contains(*this, b, a));
  if (op == "<") return Value::boolean(compare(*this, a, b, op) < 0);
  if (op == ">") return Value::boolean(compare(*this, a, b, op) > 0);
  if (op == "<=") return Value::boolean(compare(*this, a, b, op) <= 0);
  if (op == ">=") return Value::boolean(compare(*this, a, b, op) >= 0);
  if (op == "%" && a.is_string())
    fail("printf-style string formatting ('...' % x) is not supported");
  return arithmetic(*this, op, a, b);
}

}  // namespace kiln::chat
