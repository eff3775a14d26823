// Jinja's filters and tests that chat templates call, the str / dict methods
// they use (Python's), and the globals transformers adds (raise_exception,
// strftime_now). An unknown filter, test or method is an error naming it.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>

#include "chat/eval.h"
#include "kiln/error.h"

namespace kiln::chat {
namespace {

// Argument `index` (positional) or `name` (keyword); null when not given.
const Value* arg(const Args& args, size_t index, const char* name) {
  if (index < args.positional.size()) return &args.positional[index];
  for (const auto& [k, v] : args.keyword)
    if (k == name) return &v;
  return nullptr;
}

const std::string& string_arg(Evaluator& ev, const Args& args, size_t index, const char* name,
                              const char* fn) {
  const Value* v = arg(args, index, name);
  if (!v || !v->is_string())
    ev.fail(detail::concat(fn, "(): argument '", name, "' must be a string",
                           v ? std::string(", not ") + type_name(*v) : std::string(" (missing)")));
  return v->s;
}

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Python's str.strip family: whitespace, or any of `chars` (by code point).
std::string strip(const std::string& s, const Value* chars, bool left, bool right) {
  const auto cps = code_points(s);
  std::vector<std::string_view> set;
  const bool by_set = chars && chars->is_string();
  if (by_set) set = code_points(chars->s);
  auto strippable = [&](std::string_view cp) {
    if (by_set) return std::find(set.begin(), set.end(), cp) != set.end();
    return cp.size() == 1 && is_ws(cp[0]);
  };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strippable(cps[b])) ++b;
  if (right)
    while (e > b && strippable(cps[e - 1])) --e;
  std::string out;
  for (size_t k = b; k < e; ++k) out += cps[k];
  return out;
}

// ASCII case mapping: chat templates change the case of role names and keywords.
std::string upper(std::string s) {
  for (char& c : s)
    if (c >= 'a' && c <= 'z') c = char(c - 32);
  return s;
}
std::string lower(std::string s) {
  for (char& c : s)
    if (c >= 'A' && c <= 'Z') c = char(c + 32);
  return s;
}
bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (unsigned char)c >= 0x80;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool prev_alpha = false;
  for (char& c : out) {
    if (prev_alpha) c = lower(std::string(1, c))[0];
    else c = upper(std::string(1, c))[0];
    prev_alpha = is_alpha(c);
  }
  return out;
}
std::string capitalize(const std::string& s) {
  if (s.empty()) return s;
  return upper(s.substr(0, 1)) + lower(s.substr(1));
}

std::string replace(Evaluator& ev, const std::string& s, const std::string& from,
                    const std::string& to, int64_t count) {
  std::string out;
  if (from.empty()) {  // Python inserts `to` around every character
    const auto cps = code_points(s);
    int64_t done = 0;
    for (auto cp : cps) {
      if (count < 0 || done++ < count) out += to;
      out += cp;
    }
    if (count < 0 || done < count) out += to;
    ev.check_size(out.size(), "a string");
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) break;
    out.append(s, pos, hit - pos);
    out += to;
    pos = hit + from.size();
    ++done;
    ev.check_size(out.size(), "a string");
  }
  out.append(s, pos);
  return out;
}

Value split(Evaluator& ev, const std::string& s, const Value* sep, int64_t maxsplit) {
  Array out;
  if (!sep || sep->is_none()) {  // runs of whitespace, no empty parts
    size_t k = 0;
    while (true) {
      while (k < s.size() && is_ws(s[k])) ++k;
      if (k >= s.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) >= maxsplit) {
        size_t e = s.size();
        while (e > k && is_ws(s[e - 1])) --e;
        out.push_back(Value::string(s.substr(k, e - k)));
        break;
      }
      size_t e = k;
      while (e < s.size() && !is_ws(s[e])) ++e;
      out.push_back(Value::string(s.substr(k, e - k)));
      k = e;
    }
    return Value::list(std::move(out));
  }
  if (!sep->is_string()) ev.fail("split(): the separator must be a string");
  if (sep->s.empty()) ev.fail("split(): empty separator");
  size_t pos = 0;
  while (maxsplit < 0 || int64_t(out.size()) < maxsplit) {
    const size_t hit = s.find(sep->s, pos);
    if (hit == std::string::npos) break;
    out.push_back(Value::string(s.substr(pos, hit - pos)));
    pos = hit + sep->s.size();
  }
  out.push_back(Value::string(s.substr(pos)));
  return Value::list(std::move(out));
}

int64_t int_arg(Evaluator& ev, const Args& args, size_t index, const char* name, int64_t dflt) {
  const Value* v = arg(args, index, name);
  if (!v || v->is_none()) return dflt;
  if (v->kind != Value::Kind::Int)
    ev.fail(detail::concat("argument '", name, "' must be an integer"));
  return v->i;
}

bool starts_or_ends(Evaluator& ev, const std::string& s, const Value* what, bool start) {
  if (!what) ev.fail(start ? "startswith() needs an argument" : "endswith() needs an argument");
  auto test = [&](const Value& p) {
    if (!p.is_string()) ev.fail("startswith()/endswith() take a string or a tuple of strings");
    if (p.s.size() > s.size()) return false;
    return start ? s.compare(0, p.s.size(), p.s) == 0
                 : s.compare(s.size() - p.s.size(), p.s.size(), p.s) == 0;
  };
  if (what->is_array()) {
    for (const Value& p : *what->array)
      if (test(p)) return true;
    return false;
  }
  return test(*what);
}

Value string_method(Evaluator& ev, const std::string& s, const std::string& name, Args& args) {
  if (name == "strip") return Value::string(strip(s, arg(args, 0, "chars"), true, true));
  if (name == "lstrip") return Value::string(strip(s, arg(args, 0, "chars"), true, false));
  if (name == "rstrip") return Value::string(strip(s, arg(args, 0, "chars"), false, true));
  if (name == "upper") return Value::string(upper(s));
  if (name == "lower") return Value::string(lower(s));
  if (name == "title") return Value::string(title(s));
  if (name == "capitalize") return Value::string(capitalize(s));
  if (name == "startswith")
    return Value::boolean(starts_or_ends(ev, s, arg(args, 0, "prefix"), true));
  if (name == "endswith")
    return Value::boolean(starts_or_ends(ev, s, arg(args, 0, "suffix"), false));
  if (name == "split")
    return split(ev, s, arg(args, 0, "sep"), int_arg(ev, args, 1, "maxsplit", -1));
  if (name == "replace")
    return Value::string(replace(ev, s, string_arg(ev, args, 0, "old", "replace"),
                                 string_arg(ev, args, 1, "new", "replace"),
                                 int_arg(ev, args, 2, "count", -1)));
  if (name == "find") {
    const size_t hit = s.find(string_arg(ev, args, 0, "sub", "find"));
    return Value::integer(hit == std::string::npos ? -1
                                                   : int64_t(code_points(s.substr(0, hit)).size()));
  }
  if (name == "count") {
    const std::string& sub = string_arg(ev, args, 0, "sub", "count");
    if (sub.empty()) return Value::integer(int64_t(code_points(s).size()) + 1);
    int64_t n = 0;
    for (size_t p = s.find(sub); p != std::string::npos; p = s.find(sub, p + sub.size())) ++n;
    return Value::integer(n);
  }
  if (name == "join") {
    const Value* items = arg(args, 0, "iterable");
    if (!items) ev.fail("join() needs an iterable");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(ev, *items)) {
      if (!v.is_string())
        ev.fail(detail::concat("join(): expected str items, found ", type_name(v)));
      if (!first) out += s;
      out += v.s;
      first = false;
      ev.check_size(out.size(), "a string");
    }
    return Value::string(std::move(out));
  }
  if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isalnum") {
    if (s.empty()) return Value::boolean(false);
    for (char c : s) {
      const unsigned char u = static_cast<unsigned char>(c);
      const bool ok = name == "isdigit"   ? std::isdigit(u)
                      : name == "isspace" ? is_ws(c)
                      : name == "isalpha" ? std::isalpha(u)
                                          : std::isalnum(u);
      if (!ok) return Value::boolean(false);
    }
    return Value::boolean(true);
  }
  ev.fail("unsupported string method '" + name + "'");
}

Value dict_method(Evaluator& ev, const Object& o, const std::string& name, Args& args) {
  if (name == "items") {
    Array out;
    for (const auto& [k, v] : o.items) out.push_back(Value::list({Value::string(k), v}));
    return Value::list(std::move(out));
  }
  if (name == "keys") {
    Array out;
    for (const auto& kv : o.items) out.push_back(Value::string(kv.first));
    return Value::list(std::move(out));
  }
  if (name == "values") {
    Array out;
    for (const auto& kv : o.items) out.push_back(kv.second);
    return Value::list(std::move(out));
  }
  if (name == "get") {
    const Value* key = arg(args, 0, "key");
    if (!key) ev.fail("get() needs a key");
    if (key->is_string())
      if (const Value* v = o.find(key->s)) return *v;
    const Value* dflt = arg(args, 1, "default");
    return dflt ? *dflt : Value::none();
  }
  ev.fail("unsupported dict method '" + name + "'");
}

// Attribute `path` ("a.b", or an index "0") of an item, for map/selectattr/sort.
Value attribute_of(const Value& item, const std::string& path) {
  Value cur = item;
  size_t pos = 0;
  while (pos <= path.size()) {
    const size_t dot = path.find('.', pos);
    const std::string part =
        path.substr(pos, dot == std::string::npos ? std::string::npos : dot - pos);
    if (cur.is_object()) {
      const Value* v = cur.object->find(part);
      cur = v ? *v : Value();
    } else if (cur.is_array() && !part.empty() &&
               std::all_of(part.begin(), part.end(), ::isdigit)) {
      const size_t k = size_t(std::atoll(part.c_str()));
      cur = k < cur.array->size() ? (*cur.array)[k] : Value();
    } else {
      return {};
    }
    if (dot == std::string::npos) break;
    pos = dot + 1;
  }
  return cur;
}

// select / reject / selectattr / rejectattr: keeps items whose test (or truth) is `want`.
Value select(Evaluator& ev, const Value& subject, Args& args, bool by_attr, bool want) {
  Array out;
  const size_t first_test = by_attr ? 1 : 0;
  std::string attr;
  if (by_attr) attr = string_arg(ev, args, 0, "attribute", "selectattr");
  std::string test;
  if (args.positional.size() > first_test) {
    if (!args.positional[first_test].is_string()) ev.fail("select: the test name must be a string");
    test = args.positional[first_test].s;
    if (!has_test(test)) ev.fail("unknown test '" + test + "'");
  }
  Args test_args;
  for (size_t k = first_test + 1; k < args.positional.size(); ++k)
    test_args.positional.push_back(args.positional[k]);
  for (const Value& item : iterate(ev, subject)) {
    const Value v = by_attr ? attribute_of(item, attr) : item;
    Args a = test_args;
    const bool pass = test.empty() ? truthy(v) : apply_test(ev, test, v, a);
    if (pass == want) out.push_back(item);
  }
  return Value::list(std::move(out));
}

int64_t length(Evaluator& ev, const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return int64_t(code_points(v.s).size());
    case Value::Kind::Array: return int64_t(v.array->size());
    case Value::Kind::Object: return int64_t(v.object->items.size());
    case Value::Kind::Undefined: return 0;
    default: ev.fail(detail::concat("object of type ", type_name(v), " has no length"));
  }
}

Value to_int(Evaluator& ev, const Value& v, const Value* dflt) {
  switch (v.kind) {
    case Value::Kind::Int: return v;
    case Value::Kind::Bool: return Value::integer(v.b);
    case Value::Kind::Float:
      if (!std::isfinite(v.f) || std::fabs(v.f) > 9.2e18) break;
      return Value::integer(int64_t(v.f));
    case Value::Kind::String: {
      const std::string t = strip(v.s, nullptr, true, true);
      char* end = nullptr;
      errno = 0;
      const long long i = std::strtoll(t.c_str(), &end, 10);
      if (!t.empty() && *end == '\0' && errno == 0) return Value::integer(i);
      const double d = std::strtod(t.c_str(), &end);  // Jinja's int filter reads "3.7" as 3
      if (!t.empty() && *end == '\0' && std::isfinite(d) && std::fabs(d) < 9.2e18)
        return Value::integer(int64_t(d));
      break;
    }
    default: break;
  }
  (void)ev;
  return dflt ? *dflt : Value::integer(0);
}

Value sort(Evaluator& ev, const Value& subject, Args& args) {
  Array items = iterate(ev, subject);
  const Value* rev = arg(args, 0, "reverse");
  const Value* attr = arg(args, 2, "attribute");
  const bool reverse = rev && truthy(*rev);
  std::string path = attr && attr->is_string() ? attr->s : "";
  auto key = [&](const Value& v) { return path.empty() ? v : attribute_of(v, path); };
  auto less = [&](const Value& a, const Value& b) {
    const Value x = key(a), y = key(b);
    if (x.is_string() && y.is_string()) return lower(x.s) < lower(y.s);  // case_sensitive=False
    if (x.is_number() && y.is_number()) return x.as_double() < y.as_double();
    ev.fail(detail::concat("sort: cannot compare ", type_name(x), " and ", type_name(y)));
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& a, const Value& b) {
    return reverse ? less(b, a) : less(a, b);
  });
  return Value::list(std::move(items));
}

}  // namespace

Array iterate(Evaluator& ev, const Value& v) {
  switch (v.kind) {
    case Value::Kind::Array: return *v.array;
    case Value::Kind::Object: {
      Array keys;
      for (const auto& kv : v.object->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::Kind::String: {
      Array chars;
      for (auto cp : code_points(v.s)) chars.push_back(Value::string(std::string(cp)));
      return chars;
    }
    case Value::Kind::Undefined:
    case Value::Kind::None: return {};
    default: ev.fail(detail::concat("'", type_name(v), "' object is not iterable"));
  }
}

Value call_method(Evaluator& ev, const Value& self, const std::string& name, Args& args) {
  if (self.is_string()) return string_method(ev, self.s, name, args);
  if (self.is_object() && !self.object->is_namespace)
    return dict_method(ev, *self.object, name, args);
  if (self.is_undefined()) ev.fail("cannot call ." + name + "() on an undefined value");
  ev.fail(detail::concat("unsupported method '", name, "' of a ", type_name(self)));
}

Value apply_filter(Evaluator& ev, const std::string& name, Value subject, Args& args) {
  if (name == "trim") {
    // Python Jinja would print None as "None"; the reference refuses, and so
    // does kiln: a prompt with a stray "None" is worse than an error.
    if (!subject.is_string())
      ev.fail(detail::concat("trim: expected a string, found ", type_name(subject)));
    return Value::string(strip(subject.s, arg(args, 0, "chars"), true, true));
  }
  if (name == "tojson") {
    const Value* indent = arg(args, 0, "indent");
    int n = -1;
    if (indent && !indent->is_none()) {
      if (indent->kind != Value::Kind::Int || indent->i < 0 || indent->i > 64)
        ev.fail("tojson: indent must be an integer from 0 to 64");
      n = int(indent->i);
    }
    std::string json = to_json(subject, n);
    ev.check_size(json.size(), "tojson's output");
    return Value::string(std::move(json));
  }
  if (name == "length" || name == "count") return Value::integer(length(ev, subject));
  if (name == "default" || name == "d") {
    const Value* dflt = arg(args, 0, "default_value");
    const Value* boolean = arg(args, 1, "boolean");
    const bool use = subject.is_undefined() || (boolean && truthy(*boolean) && !truthy(subject));
    return use ? (dflt ? *dflt : Value::string("")) : subject;
  }
  if (name == "join") {
    const Value* sep = arg(args, 0, "d");
    const Value* attr = arg(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& v : iterate(ev, subject)) {
      if (!first) out += sep ? to_str(*sep) : "";
      out += to_str(attr && attr->is_string() ? attribute_of(v, attr->s) : v);
      first = false;
      ev.check_size(out.size(), "a joined string");
    }
    return Value::string(std::move(out));
  }
  if (name == "items") {
    if (subject.is_undefined()) return Value::list({});
    if (!subject.is_object())
      ev.fail(detail::concat("items: expected a dict, found ", type_name(subject)));
    return dict_method(ev, *subject.object, "items", args);
  }
  if (name == "upper") return Value::string(upper(to_str(subject)));
  if (name == "lower") return Value::string(lower(to_str(subject)));
  if (name == "capitalize") return Value::string(capitalize(to_str(subject)));
  if (name == "title") return Value::string(title(to_str(subject)));
  if (name == "string") return Value::string(to_str(subject));
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return subject;
    ev.fail("unsupported filter 'escape' (chat templates are rendered without autoescape)");
  }
  if (name == "replace") {
    if (!subject.is_string()) subject = Value::string(to_str(subject));
    return Value::string(replace(ev, subject.s, string_arg(ev, args, 0, "old", "replace"),
                                 string_arg(ev, args, 1, "new", "replace"),
                                 int_arg(ev, args, 2, "count", -1)));
  }
  if (name == "selectattr") return select(ev, subject, args, true, true);
  if (name == "rejectattr") return select(ev, subject, args, true, false);
  if (name == "select") return select(ev, subject, args, false, true);
  if (name == "reject") return select(ev, subject, args, false, false);
  if (name == "map") {
    Array out;
    const Value* attr = arg(args, 99, "attribute");
    if (attr) {
      if (!attr->is_string()) ev.fail("map: attribute must be a string");
      const Value* dflt = arg(args, 99, "default");
      for (const Value& v : iterate(ev, subject)) {
        Value a = attribute_of(v, attr->s);
        out.push_back(a.is_undefined() && dflt ? *dflt : a);
      }
      return Value::list(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string())
      ev.fail("map needs a filter name or attribute=");
    const std::string filter = args.positional[0].s;
    Args rest;
    rest.positional.assign(args.positional.begin() + 1, args.positional.end());
    rest.keyword = args.keyword;
    for (const Value& v : iterate(ev, subject)) {
      Args a = rest;
      out.push_back(apply_filter(ev, filter, v, a));
    }
    return Value::list(std::move(out));
  }
  if (name == "first" || name == "last") {
    const Array items = iterate(ev, subject);
    if (items.empty()) return {};
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::list(iterate(ev, subject));
  if (name == "reverse") {
    if (subject.is_string()) {
      auto cps = code_points(subject.s);
      std::string out;
      for (size_t k = cps.size(); k-- > 0;) out += cps[k];
      return Value::string(std::move(out));
    }
    Array items = iterate(ev, subject);
    std::reverse(items.begin(), items.end());
    return Value::list(std::move(items));
  }
  if (name == "unique") {
    Array out;
    for (const Value& v : iterate(ev, subject))
      if (std::none_of(out.begin(), out.end(), [&](const Value& o) { return equal(o, v); }))
        out.push_back(v);
    return Value::list(std::move(out));
  }
  if (name == "sort") return sort(ev, subject, args);
  if (name == "int") return to_int(ev, subject, arg(args, 0, "default"));
  if (name == "float") {
    if (subject.is_number()) return Value::number(subject.as_double());
    if (subject.is_string()) {
      char* end = nullptr;
      const std::string t = strip(subject.s, nullptr, true, true);
      const double d = std::strtod(t.c_str(), &end);
      if (!t.empty() && *end == '\0') return Value::number(d);
    }
    const Value* dflt = arg(args, 0, "default");
    return dflt ? *dflt : Value::number(0.0);
  }
  if (name == "abs") {
    if (!subject.is_number())
      ev.fail(detail::concat("abs: expected a number, found ", type_name(subject)));
    if (subject.kind == Value::Kind::Float) return Value::number(std::fabs(subject.f));
    return Value::integer(std::llabs(subject.kind == Value::Kind::Bool ? subject.b : subject.i));
  }
  if (name == "round") {
    if (!subject.is_number())
      ev.fail(detail::concat("round: expected a number, found ", type_name(subject)));
    const int64_t digits = int_arg(ev, args, 0, "precision", 0);
    const double scale = std::pow(10.0, double(digits));
    return Value::number(std::nearbyint(subject.as_double() * scale) /
                         scale);  // half to even, as Python
  }
  if (name == "min" || name == "max" || name == "sum") {
    const Array items = iterate(ev, subject);
    if (name == "sum") {
      Value total = Value::integer(0);
      for (const Value& v : items) {
        if (!v.is_number()) ev.fail("sum: items must be numbers");
        total = (total.kind == Value::Kind::Int && v.kind != Value::Kind::Float)
                    ? Value::integer(total.i + (v.kind == Value::Kind::Bool ? v.b : v.i))
                    : Value::number(total.as_double() + v.as_double());
      }
      return total;
    }
    if (items.empty()) return {};
    Value best = items[0];
    for (const Value& v : items) {
      if (!v.is_number() && !v.is_string()) ev.fail(name + ": items must be numbers or strings");
      const bool less = v.is_number() && best.is_number() ? v.as_double() < best.as_double()
                        : v.is_string() && best.is_string()
                            ? v.s < best.s
                            : (ev.fail(name + ": cannot compare numbers and strings"), false);
      const bool greater = !less && !equal(v, best);
      if (name == "min" ? less : greater) best = v;
    }
    return best;
  }
  if (name == "indent") {
    const Value* width = arg(args, 0, "width");
    const std::string pad =
        width && width->is_string()
            ? width->s
            : std::string(size_t(width ? std::clamp<int64_t>(width->i, 0, 1024) : 4), ' ');
    const Value* first = arg(args, 1, "first");
    const Value* blank = arg(args, 2, "blank");
    const std::string s = to_str(subject);
    std::string out;
    size_t pos = 0;
    bool first_line = true;
    while (pos <= s.size()) {
      size_t nl = s.find('\n', pos);
      const std::string line =
          s.substr(pos, nl == std::string::npos ? std::string::npos : nl - pos);
      const bool indent_it =
          first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)));
      if (indent_it) out += pad;
      out += line;
      if (nl == std::string::npos) break;
      out += '\n';
      pos = nl + 1;
      first_line = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "wordcount")
    return Value::integer(int64_t(split(ev, to_str(subject), nullptr, -1).array->size()));
  if (name == "dictsort") {
    if (!subject.is_object()) ev.fail("dictsort: expected a dict");
    Array items = *dict_method(ev, *subject.object, "items", args).array;
    std::stable_sort(items.begin(), items.end(), [](const Value& a, const Value& b) {
      return lower((*a.array)[0].s) < lower((*b.array)[0].s);
    });
    return Value::list(std::move(items));
  }
  ev.fail("unknown filter '" + name + "'");
}

static const char* const kTests[] = {
    "defined", "undefined", "none",        "string", "mapping", "iterable", "number",
    "integer", "float",     "sequence",    "true",   "false",   "boolean",  "callable",
    "odd",     "even",      "divisibleby", "eq",     "equalto", "==",       "ne",
    "!=",      "lt",        "<",           "gt",     ">",       "le",       "<=",
    "ge",      ">=",        "in",          "lower",  "upper",   "sameas"};

bool has_test(const std::string& name) {
  return std::any_of(std::begin(kTests), std::end(kTests),
                     [&](const char* t) { return name == t; });
}

bool apply_test(Evaluator& ev, const std::string& name, const Value& v, Args& args) {
  using K = Value::Kind;
  auto other = [&]() -> const Value& {
    const Value* o = arg(args, 0, "other");
    if (!o) ev.fail("test '" + name + "' needs an argument");
    return *o;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_object() && !v.object->is_namespace;
  if (name == "iterable")
    return v.is_array() || v.is_string() || (v.is_object() && !v.object->is_namespace);
  if (name == "sequence")
    return v.is_array() || v.is_string() || (v.is_object() && !v.object->is_namespace);
  if (name == "number")
    return v.kind == K::Int || v.kind == K::Float;  // Jinja: bools are not numbers
  if (name == "integer") return v.kind == K::Int;
  if (name == "float") return v.kind == K::Float;
  if (name == "boolean") return v.kind == K::Bool;
  if (name == "true") return v.kind == K::Bool && v.b;
  if (name == "false") return v.kind == K::Bool && !v.b;
  if (name == "callable") return v.kind == K::Function;
  if (name == "odd" || name == "even") {
    if (v.kind != K::Int) ev.fail("test '" + name + "' needs an integer");
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const Value& d = other();
    if (v.kind != K::Int || d.kind != K::Int || d.i == 0)
      ev.fail("divisibleby needs integers (and not 0)");
    return v.i % d.i == 0;
  }
  if (name == "lower") return v.is_string() && lower(v.s) == v.s;
  if (name == "upper") return v.is_string() && upper(v.s) == v.s;
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    if (v.is_array()) return v.array == o.array;
    if (v.is_object()) return v.object == o.object;
    return equal(v, o);
  }
  if (name == "in") {
    const Value& o = other();
    if (o.is_string()) return v.is_string() && o.s.find(v.s) != std::string::npos;
    for (const Value& item : iterate(ev, o))
      if (equal(item, v)) return true;
    return false;
  }
  if (name == "lt" || name == "<" || name == "gt" || name == ">" || name == "le" || name == "<=" ||
      name == "ge" || name == ">=") {
    const Value& o = other();
    if (!v.is_number() || !o.is_number()) ev.fail("test '" + name + "' compares numbers");
    const double a = v.as_double(), b = o.as_double();
    if (name == "lt" || name == "<") return a < b;
    if (name == "gt" || name == ">") return a > b;
    if (name == "le" || name == "<=") return a <= b;
    return a >= b;
  }
  ev.fail("unknown test '" + name + "'");
}

void add_globals(std::unordered_map<std::string, Value>& globals) {
  globals["range"] = Value::callable([](Evaluator& ev, Args& args) {
    int64_t start = 0, stop = 0, step = 1;
    auto num = [&](size_t k) {
      if (args.positional[k].kind != Value::Kind::Int) ev.fail("range() takes integers");
      return args.positional[k].i;
    };
    if (args.positional.size() == 1) stop = num(0);
    else if (args.positional.size() == 2 || args.positional.size() == 3) {
      start = num(0);
      stop = num(1);
      if (args.positional.size() == 3) step = num(2);
    } else {
      ev.fail("range() takes 1 to 3 arguments");
    }
    if (step == 0) ev.fail("range() step must not be zero");
    const double count = std::ceil((double(stop) - double(start)) / double(step));
    if (count > double(ev.limits().max_output) || count > double(ev.limits().max_steps))
      ev.fail(detail::concat("range() of ", count, " items exceeds the render limits"));
    Array out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step)
      out.push_back(Value::integer(k));
    return Value::list(std::move(out));
  });
  globals["namespace"] = Value::callable([](Evaluator& ev, Args& args) {
    auto ns = std::make_shared<Object>();
    ns->is_namespace = true;
    for (const Value& init : args.positional) {  // namespace(dict) copies the dict
      if (!init.is_object()) ev.fail("namespace() takes a dict or keyword arguments");
      for (const auto& [k, v] : init.object->items) ns->set(k, v);
    }
    for (auto& [k, v] : args.keyword) ns->set(k, v);
    return Value::dict(ns);
  });
  globals["dict"] = Value::callable([](Evaluator& ev, Args& args) {
    auto o = std::make_shared<Object>();
    if (!args.positional.empty()) ev.fail("dict() takes keyword arguments only here");
    for (auto& [k, v] : args.keyword) o->set(k, v);
    return Value::dict(o);
  });
  globals["raise_exception"] = Value::callable([](Evaluator& ev, Args& args) -> Value {
    const Value* msg = arg(args, 0, "message");
    ev.fail("the template raised an exception: " +
            (msg ? to_str(*msg) : std::string("(no message)")));
  });
  globals["strftime_now"] = Value::callable([](Evaluator& ev, Args& args) {
    const Value* fmt = arg(args, 0, "format");
    if (!fmt || !fmt->is_string()) ev.fail("strftime_now() needs a format string");
    const std::time_t now = ev.limits().now ? ev.limits().now() : std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[512];
    const size_t n = std::strftime(buf, sizeof buf, fmt->s.c_str(), &tm);
    if (n == 0 && !fmt->s.empty())
      ev.fail("strftime_now(): the formatted date is empty or too long");
    return Value::string(std::string(buf, n));
  });
}

}  // namespace kiln::chat
