// Reading the fields of a JSON object (config.json and friends) so that each one
// is either used, listed as harmless, or reported: a field nobody read is an
// error naming it.
#pragma once
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <set>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "kiln/error.h"

namespace kiln::models::detail {

using Json = nlohmann::ordered_json;

// Parses `text` as one JSON object; errors name `file`.
Json parse_json_object(std::string_view text, const std::string& file);

class Fields {
 public:
  Fields(const Json& obj, std::string file, std::string what)
      : obj_(obj), file_(std::move(file)), what_(std::move(what)) {}

  bool has(const std::string& key) const { return obj_.contains(key) && !obj_[key].is_null(); }
  // The value, marked as read; null when absent.
  const Json& get(const std::string& key);

  int64_t integer(const std::string& key, int64_t fallback);
  // > 0; fallback when absent (a fallback <= 0: the field is required).
  int64_t positive(const std::string& key, int64_t fallback);
  double number(const std::string& key, double fallback);
  bool boolean(const std::string& key, bool fallback);
  std::string string(const std::string& key, const std::string& fallback);

  // Fields that change nothing kiln computes (dtypes, versions, ids of special
  // tokens read elsewhere, caching flags).
  void ignore(std::initializer_list<const char*> keys);
  void ignore(const std::string& key) { read_.insert(key); }
  // Throws naming the first field nobody read.
  void reject_unread() const;

  [[noreturn]] void fail_field(const std::string& key, const std::string& why) const;
  const std::string& file() const { return file_; }

 private:
  const Json& obj_;
  std::string file_, what_;
  std::set<std::string> read_;
};

}  // namespace kiln::models::detail
