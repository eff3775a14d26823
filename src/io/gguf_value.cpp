// GgufValue: typed GGUF metadata values (construction, checked reads, printing).
#include <cstring>
#include <limits>
#include <sstream>

#include "io/gguf_format.h"

namespace kiln {

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::u8: return "u8";
    case GgufType::i8: return "i8";
    case GgufType::u16: return "u16";
    case GgufType::i16: return "i16";
    case GgufType::u32: return "u32";
    case GgufType::i32: return "i32";
    case GgufType::f32: return "f32";
    case GgufType::boolean: return "bool";
    case GgufType::string: return "string";
    case GgufType::array: return "array";
    case GgufType::u64: return "u64";
    case GgufType::i64: return "i64";
    case GgufType::f64: return "f64";
  }
  return "?";
}

namespace {

template <class T>
std::vector<uint8_t> bytes_of(std::span<const T> v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}

template <class T>
T load(const std::vector<uint8_t>& raw, size_t i) {
  T v;
  std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
  return v;
}

// Element i of a numeric/bool payload as a wide signed or unsigned value.
struct Wide {
  bool negative = false;
  uint64_t magnitude = 0;  // |value|
};

Wide int_at(GgufType t, const std::vector<uint8_t>& raw, size_t i) {
  auto from_signed = [](int64_t v) {
    return v < 0 ? Wide{true, uint64_t(0) - uint64_t(v)} : Wide{false, uint64_t(v)};
  };
  switch (t) {
    case GgufType::u8: return {false, load<uint8_t>(raw, i)};
    case GgufType::boolean: return {false, load<uint8_t>(raw, i)};
    case GgufType::u16: return {false, load<uint16_t>(raw, i)};
    case GgufType::u32: return {false, load<uint32_t>(raw, i)};
    case GgufType::u64: return {false, load<uint64_t>(raw, i)};
    case GgufType::i8: return from_signed(load<int8_t>(raw, i));
    case GgufType::i16: return from_signed(load<int16_t>(raw, i));
    case GgufType::i32: return from_signed(load<int32_t>(raw, i));
    case GgufType::i64: return from_signed(load<int64_t>(raw, i));
    default: return {};
  }
}

int64_t to_int64(const Wide& w, const std::string& subject) {
  if (!w.negative && w.magnitude > uint64_t(std::numeric_limits<int64_t>::max()))
    fail("gguf", subject, " is ", w.magnitude, ", which does not fit in int64");
  return w.negative ? int64_t(0 - w.magnitude) : int64_t(w.magnitude);
}

double float_at(GgufType t, const std::vector<uint8_t>& raw, size_t i) {
  if (t == GgufType::f32) return load<float>(raw, i);
  if (t == GgufType::f64) return load<double>(raw, i);
  Wide w = int_at(t, raw, i);
  return w.negative ? -double(w.magnitude) : double(w.magnitude);
}

bool is_int_or_bool(GgufType t) { return gguf::is_integer(t) || t == GgufType::boolean; }
bool is_number(GgufType t) { return is_int_or_bool(t) || t == GgufType::f32 || t == GgufType::f64; }

}  // namespace

#define KILN_GGUF_SCALAR(T, G)                                                    \
  GgufValue::GgufValue(T v) : type_(GgufType::G), elem_(GgufType::G), count_(1) { \
    raw_ = bytes_of(std::span<const T>(&v, 1));                                   \
  }                                                                               \
  GgufValue::GgufValue(std::span<const T> v)                                      \
      : type_(GgufType::array), elem_(GgufType::G), count_(v.size()), raw_(bytes_of(v)) {}
KILN_GGUF_SCALAR(uint8_t, u8)
KILN_GGUF_SCALAR(int8_t, i8)
KILN_GGUF_SCALAR(uint16_t, u16)
KILN_GGUF_SCALAR(int16_t, i16)
KILN_GGUF_SCALAR(uint32_t, u32)
KILN_GGUF_SCALAR(int32_t, i32)
KILN_GGUF_SCALAR(uint64_t, u64)
KILN_GGUF_SCALAR(int64_t, i64)
KILN_GGUF_SCALAR(float, f32)
KILN_GGUF_SCALAR(double, f64)
#undef KILN_GGUF_SCALAR

GgufValue::GgufValue(bool v) : type_(GgufType::boolean), elem_(GgufType::boolean), count_(1) {
  raw_ = {uint8_t(v ? 1 : 0)};
}

GgufValue::GgufValue(const std::vector<bool>& v)
    : type_(GgufType::array), elem_(GgufType::boolean), count_(v.size()) {
  raw_.reserve(v.size());
  for (bool b : v) raw_.push_back(b ? 1 : 0);
}

GgufValue::GgufValue(std::string v) : type_(GgufType::string), elem_(GgufType::string), count_(1) {
  strings_.push_back(std::move(v));
}

GgufValue::GgufValue(std::vector<std::string> v)
    : type_(GgufType::array), elem_(GgufType::string), count_(v.size()), strings_(std::move(v)) {}

GgufValue GgufValue::array_of(std::vector<GgufValue> arrays) {
  for (const GgufValue& a : arrays)
    if (!a.is_array())
      fail("gguf", "array_of: every element must be an array, got a ", gguf_type_name(a.type()));
  size_t n = arrays.size();
  return GgufValueAccess::make(GgufType::array, GgufType::array, n, {}, {}, std::move(arrays));
}

size_t GgufValue::size() const { return count_; }

std::string GgufValue::subject() const { return where_.empty() ? "value" : where_; }

bool GgufValue::operator==(const GgufValue& o) const {
  // where_ is not part of the value: a value read from a file equals the one written.
  return type_ == o.type_ && elem_ == o.elem_ && count_ == o.count_ && raw_ == o.raw_ &&
         strings_ == o.strings_ && arrays_ == o.arrays_;
}

int64_t GgufValue::as_int() const {
  if (is_array() || !is_int_or_bool(type_))
    fail("gguf", subject(), " is ", is_array() ? "an array" : gguf_type_name(type_),
         ", not an integer");
  return to_int64(int_at(type_, raw_, 0), subject());
}

uint64_t GgufValue::as_uint() const {
  if (is_array() || !is_int_or_bool(type_))
    fail("gguf", subject(), " is ", is_array() ? "an array" : gguf_type_name(type_),
         ", not an integer");
  Wide w = int_at(type_, raw_, 0);
  if (w.negative) fail("gguf", subject(), " is -", w.magnitude, ", not an unsigned integer");
  return w.magnitude;
}

double GgufValue::as_float() const {
  if (is_array() || !is_number(type_))
    fail("gguf", subject(), " is ", is_array() ? "an array" : gguf_type_name(type_),
         ", not a number");
  return float_at(type_, raw_, 0);
}

bool GgufValue::as_bool() const {
  if (type_ != GgufType::boolean)
    fail("gguf", subject(), " is ", gguf_type_name(type_), ", not a bool");
  return raw_[0] != 0;
}

const std::string& GgufValue::as_string() const {
  if (type_ != GgufType::string)
    fail("gguf", subject(), " is ", gguf_type_name(type_), ", not a string");
  return strings_[0];
}

std::vector<int64_t> GgufValue::as_ints() const {
  if (!is_array() || !is_int_or_bool(elem_))
    fail("gguf", subject(), " is ", is_array() ? "an array of " : "", gguf_type_name(elem_),
         ", not an array of integers");
  std::vector<int64_t> out(count_);
  for (size_t i = 0; i < count_; ++i) out[i] = to_int64(int_at(elem_, raw_, i), subject());
  return out;
}

std::vector<double> GgufValue::as_floats() const {
  if (!is_array() || !is_number(elem_))
    fail("gguf", subject(), " is ", is_array() ? "an array of " : "", gguf_type_name(elem_),
         ", not an array of numbers");
  std::vector<double> out(count_);
  for (size_t i = 0; i < count_; ++i) out[i] = float_at(elem_, raw_, i);
  return out;
}

const std::vector<std::string>& GgufValue::as_strings() const {
  if (!is_array() || elem_ != GgufType::string)
    fail("gguf", subject(), " is ", is_array() ? "an array of " : "", gguf_type_name(elem_),
         ", not an array of strings");
  return strings_;
}

const std::vector<GgufValue>& GgufValue::as_arrays() const {
  if (!is_array() || elem_ != GgufType::array)
    fail("gguf", subject(), " is ", is_array() ? "an array of " : "", gguf_type_name(elem_),
         ", not an array of arrays");
  return arrays_;
}

std::string GgufValue::str() const {
  std::ostringstream os;
  auto element = [&](size_t i) {
    if (elem_ == GgufType::string) {
      os << '"' << strings_[i] << '"';
    } else if (elem_ == GgufType::array) {
      os << arrays_[i].str();
    } else if (elem_ == GgufType::boolean) {
      os << (raw_[i] ? "true" : "false");
    } else if (elem_ == GgufType::f32 || elem_ == GgufType::f64) {
      os << float_at(elem_, raw_, i);
    } else {
      Wide w = int_at(elem_, raw_, i);
      os << (w.negative ? "-" : "") << w.magnitude;
    }
  };
  if (!is_array()) {
    element(0);
    return os.str();
  }
  constexpr size_t kShown = 8;
  os << "[";
  for (size_t i = 0; i < count_ && i < kShown; ++i) {
    if (i) os << ", ";
    element(i);
  }
  if (count_ > kShown) os << ", ... (" << count_ << " total)";
  os << "]";
  return os.str();
}

}  // namespace kiln
