// A SAX handler base for walking a JSON document for its structure and keys
// alone (safetensors headers, shard indexes): every value event is accepted
// and ignored, so a subclass writes only the nesting, key and error events.
// Scanning this way is linear, where nlohmann's ordered_json and parse
// callbacks rescan an object for each of its keys.
#pragma once

#include <nlohmann/json.hpp>

namespace kiln::detail {

struct JsonKeyScan : nlohmann::json_sax<nlohmann::json> {
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
};

}  // namespace kiln::detail
