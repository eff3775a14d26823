// Value semantics as Python and Jinja define them: truth, equality, str(),
// repr() and json.dumps().
#include "chat/value.h"

#include <charconv>
#include <cmath>
#include <cstdio>

namespace kiln::chat {

const Value* Object::find(const std::string& key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}

void Object::set(const std::string& key, Value v) {
  for (auto& [k, old] : items)
    if (k == key) {
      old = std::move(v);
      return;
    }
  items.emplace_back(key, std::move(v));
}

Value Value::boolean(bool v) {
  Value r = with_kind(Kind::Bool);
  r.b = v;
  return r;
}
Value Value::integer(int64_t v) {
  Value r = with_kind(Kind::Int);
  r.i = v;
  return r;
}
Value Value::number(double v) {
  Value r = with_kind(Kind::Float);
  r.f = v;
  return r;
}
Value Value::string(std::string v) {
  Value r = with_kind(Kind::String);
  r.s = std::move(v);
  return r;
}
Value Value::list(Array items) {
  Value r = with_kind(Kind::Array);
  r.array = std::make_shared<Array>(std::move(items));
  return r;
}
Value Value::dict(std::shared_ptr<Object> o) {
  Value r = with_kind(Kind::Object);
  r.object = std::move(o);
  return r;
}
Value Value::callable(Function fn) {
  Value r = with_kind(Kind::Function);
  r.function = std::make_shared<Function>(std::move(fn));
  return r;
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "undefined";
    case Value::Kind::None: return "NoneType";
    case Value::Kind::Bool: return "bool";
    case Value::Kind::Int: return "int";
    case Value::Kind::Float: return "float";
    case Value::Kind::String: return "str";
    case Value::Kind::Array: return "list";
    case Value::Kind::Object: return v.object->is_namespace ? "Namespace" : "dict";
    case Value::Kind::Function: return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return false;
    case Value::Kind::Bool: return v.b;
    case Value::Kind::Int: return v.i != 0;
    case Value::Kind::Float: return v.f != 0;
    case Value::Kind::String: return !v.s.empty();
    case Value::Kind::Array: return !v.array->empty();
    case Value::Kind::Object: return v.object->is_namespace || !v.object->items.empty();
    case Value::Kind::Function: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind != Value::Kind::Float && b.kind != Value::Kind::Float)
      return (a.kind == Value::Kind::Bool ? a.b : a.i) == (b.kind == Value::Kind::Bool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: return true;
    case Value::Kind::String: return a.s == b.s;
    case Value::Kind::Array:
      if (a.array->size() != b.array->size()) return false;
      for (size_t k = 0; k < a.array->size(); ++k)
        if (!equal((*a.array)[k], (*b.array)[k])) return false;
      return true;
    case Value::Kind::Object: {
      if (a.object == b.object) return true;
      if (a.object->items.size() != b.object->items.size()) return false;
      for (const auto& [k, v] : a.object->items) {
        const Value* o = b.object->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    case Value::Kind::Function: return a.function == b.function;
    default: return false;
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  // Shortest round-trip digits in scientific form, then laid out as Python's
  // repr does: positional for exponents -4..15, scientific otherwise.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exp = std::stoi(sci.substr(e_pos + 1));
  const bool negative = mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -4 && exp < 16) {
    if (exp < 0) {
      out = "0.";
      out.append(size_t(-exp - 1), '0');
      out += digits;
    } else if (size_t(exp) + 1 >= digits.size()) {
      out = digits + std::string(size_t(exp) + 1 - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp) + 1) + "." + digits.substr(size_t(exp) + 1);
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) {
      out += '.';
      out.append(digits, 1);
    }
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
    out += e;
  }
  if (negative) out.insert(out.begin(), '-');
  return out;
}

static std::string quote_python(const std::string& s) {
  // Python prefers single quotes unless the text holds one and no double quote.
  const bool dq = s.find('\'') != std::string::npos && s.find('"') == std::string::npos;
  const char q = dq ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == q || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += char(c);
    }
  }
  return out + q;
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Value::Kind::String: return quote_python(v.s);
    case Value::Kind::Array: {
      std::string out = "[";
      for (size_t k = 0; k < v.array->size(); ++k) out += (k ? ", " : "") + repr((*v.array)[k]);
      return out + "]";
    }
    case Value::Kind::Object: {
      if (v.object->is_namespace) return "<Namespace>";
      std::string out = "{";
      bool first = true;
      for (const auto& [k, item] : v.object->items) {
        out += (first ? "" : ", ") + quote_python(k) + ": " + repr(item);
        first = false;
      }
      return out + "}";
    }
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind) {
    case Value::Kind::Undefined: return "";
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return v.b ? "True" : "False";
    case Value::Kind::Int: return std::to_string(v.i);
    case Value::Kind::Float: return float_repr(v.f);
    case Value::Kind::String: return v.s;
    case Value::Kind::Function: return "<function>";
    default: return repr(v);
  }
}

static void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

static void json_dump(std::string& out, const Value& v, int indent, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    out.append(size_t(indent) * size_t(lvl), ' ');
  };
  switch (v.kind) {
    case Value::Kind::Undefined:
    case Value::Kind::None: out += "null"; return;
    case Value::Kind::Bool: out += v.b ? "true" : "false"; return;
    case Value::Kind::Int: out += std::to_string(v.i); return;
    case Value::Kind::Float:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      return;
    case Value::Kind::String: json_string(out, v.s); return;
    case Value::Kind::Function: out += "null"; return;
    case Value::Kind::Array: {
      if (v.array->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.array->size(); ++k) {
        if (k) out += indent >= 0 ? "," : ", ";
        if (indent >= 0) newline(level + 1);
        json_dump(out, (*v.array)[k], indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += ']';
      return;
    }
    case Value::Kind::Object: {
      if (v.object->items.empty()) {
        out += "{}";
        return;
      }
      out += '{';
      bool first = true;
      for (const auto& [k, item] : v.object->items) {
        if (!first) out += indent >= 0 ? "," : ", ";
        first = false;
        if (indent >= 0) newline(level + 1);
        json_string(out, k);
        out += ": ";
        json_dump(out, item, indent, level + 1);
      }
      if (indent >= 0) newline(level);
      out += '}';
      return;
    }
  }
}

std::string to_json(const Value& v, int indent) {
  std::string out;
  json_dump(out, v, indent, 0);
  return out;
}

std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  out.reserve(s.size());
  size_t k = 0;
  while (k < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (k + n > s.size()) n = 1;
    for (size_t j = 1; j < n; ++j)
      if ((static_cast<unsigned char>(s[k + j]) & 0xC0) != 0x80) n = 1;
    out.push_back(s.substr(k, n));
    k += n;
  }
  return out;
}

}  // namespace kiln::chat
