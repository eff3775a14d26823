#include "models/json_fields.h"

namespace kiln::models::detail {
namespace {

// config.json files are flat objects with a few small nested ones (rope_scaling,
// task_specific_params): a shallow limit keeps hostile nesting from recursing.
constexpr int kMaxDepth = 16;

const char* type_name(const Json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "a boolean";
  if (v.is_number()) return "a number";
  if (v.is_string()) return "a string";
  if (v.is_array()) return "an array";
  return "an object";
}

}  // namespace

Json parse_json_object(std::string_view text, const std::string& file) {
  int depth = 0;
  bool too_deep = false;
  auto cb = [&](int d, Json::parse_event_t ev, Json&) {
    if (ev == Json::parse_event_t::object_start || ev == Json::parse_event_t::array_start) {
      depth = d + 1;
      if (depth > kMaxDepth) too_deep = true;
    }
    return !too_deep;
  };
  Json j;
  try {
    j = Json::parse(text.begin(), text.end(), cb);
  } catch (const nlohmann::json::exception& e) {
    fail("models", file, ": not valid JSON (", e.what(), ")");
  }
  if (too_deep) fail("models", file, ": JSON nests deeper than ", kMaxDepth, " levels");
  if (!j.is_object()) fail("models", file, ": expected a JSON object, got ", type_name(j));
  return j;
}

const Json& Fields::get(const std::string& key) {
  read_.insert(key);
  static const Json null_value;
  auto it = obj_.find(key);
  return it == obj_.end() ? null_value : *it;
}

void Fields::fail_field(const std::string& key, const std::string& why) const {
  fail("models", file_, ": field '", key, "' ", why);
}

int64_t Fields::integer(const std::string& key, int64_t fallback) {
  const Json& v = get(key);
  if (v.is_null()) return fallback;
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) return int64_t(d);
  }
  fail_field(key, std::string("must be an integer, got ") + v.dump());
}

int64_t Fields::positive(const std::string& key, int64_t fallback) {
  if (!has(key) && fallback <= 0) fail_field(key, "is missing (it has no default)");
  const int64_t v = integer(key, fallback);
  if (v <= 0) fail_field(key, "must be positive, got " + std::to_string(v));
  return v;
}

double Fields::number(const std::string& key, double fallback) {
  const Json& v = get(key);
  if (v.is_null()) return fallback;
  if (!v.is_number()) fail_field(key, std::string("must be a number, got ") + type_name(v));
  const double d = v.get<double>();
  if (!std::isfinite(d)) fail_field(key, "must be finite");
  return d;
}

bool Fields::boolean(const std::string& key, bool fallback) {
  const Json& v = get(key);
  if (v.is_null()) return fallback;
  if (!v.is_boolean()) fail_field(key, std::string("must be true or false, got ") + type_name(v));
  return v.get<bool>();
}

std::string Fields::string(const std::string& key, const std::string& fallback) {
  const Json& v = get(key);
  if (v.is_null()) return fallback;
  if (!v.is_string()) fail_field(key, std::string("must be a string, got ") + type_name(v));
  return v.get<std::string>();
}

void Fields::ignore(std::initializer_list<const char*> keys) {
  for (const char* k : keys) read_.insert(k);
}

void Fields::reject_unread() const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it)
    if (!read_.count(it.key()))
      fail("models", file_, ": field '", it.key(), "' is not supported by kiln's ", what_,
           " (kiln does not ignore config fields it does not implement)");
}

}  // namespace kiln::models::detail
