// config.json -> LlamaConfig / Gpt2Config. Each field is used, listed here as
// harmless, or an error naming it.
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "kiln/models.h"
#include "models/architecture.h"
#include "models/json_fields.h"
#include "models/llama_family.h"

namespace kiln::models {
namespace {

using detail::Architecture;
using detail::Fields;
using detail::Json;

// Fields of every config that change nothing kiln computes: bookkeeping,
// dtypes (the loader converts what the files hold), caching and output flags,
// initialisation (kiln::nn has its own init), and token ids read by read_token_ids.
void ignore_harmless(Fields& f) {
  f.ignore({"architectures", "model_type", "torch_dtype", "dtype", "transformers_version",
            "_name_or_path", "initializer_range", "use_cache", "pad_token_id", "bos_token_id",
            "eos_token_id", "output_attentions", "output_hidden_states", "return_dict",
            "tokenizer_class", "_attn_implementation_autoset"});
}

std::vector<int64_t> token_ids(Fields& f, const std::string& key) {
  const Json& v = f.get(key);
  std::vector<int64_t> out;
  if (v.is_null()) return out;
  auto one = [&](const Json& x) {
    if (!x.is_number_integer() || x.get<int64_t>() < 0)
      f.fail_field(key, "must be a token id (an integer >= 0) or a list of them, got " + v.dump());
    out.push_back(x.get<int64_t>());
  };
  if (v.is_array()) {
    for (const Json& x : v) one(x);
  } else {
    one(v);
  }
  return out;
}

void read_token_ids(Fields& f, GenerationConfig& g) {
  if (f.has("eos_token_id")) g.eos_token_ids = token_ids(f, "eos_token_id");
  if (f.has("bos_token_id")) {
    const std::vector<int64_t> b = token_ids(f, "bos_token_id");
    if (b.size() != 1) f.fail_field("bos_token_id", "must be one token id");
    g.bos_token_id = b[0];
  }
}

std::vector<double> factor_list(Fields& f, const std::string& key, int64_t n) {
  const Json& v = f.get(key);
  if (!v.is_array() || int64_t(v.size()) != n)
    f.fail_field(key, "must be a list of " + std::to_string(n) + " numbers (rotary dims / 2)");
  std::vector<double> out;
  for (const Json& x : v) {
    if (!x.is_number() || !(x.get<double>() > 0))
      f.fail_field(key, "must hold numbers > 0, got " + x.dump());
    out.push_back(x.get<double>());
  }
  return out;
}

// The RoPE scaling of the object `v` (config.json's "rope_scaling", or the newer
// "rope_parameters", which may also hold rope_theta), as transformers reads it:
// "rope_type", or the older "type"; "default" (or none given): no scaling.
// Each type reads its own fields; any other field is an error.
std::optional<RopeScaling> read_rope_scaling(const Json& v, const std::string& file,
                                             const std::string& key, LlamaConfig& c,
                                             int64_t rotary_dim) {
  if (!v.is_object()) fail("models", file, ": field '", key, "' must be an object or null");
  Fields f(v, file, key);
  std::string type = f.string("rope_type", "");
  const std::string legacy = f.string("type", "");
  if (type.empty()) type = legacy;
  if (!legacy.empty() && legacy != type)
    f.fail_field("type", "is '" + legacy + "' but rope_type is '" + type + "'");
  if (f.has("rope_theta")) c.rope_theta = f.number("rope_theta", 0);
  if (f.has("partial_rotary_factor") &&
      f.number("partial_rotary_factor", 1) != double(rotary_dim) / double(c.head_dim))
    f.fail_field("partial_rotary_factor",
                 "differs from the model's (" + std::to_string(rotary_dim) + " of " +
                     std::to_string(c.head_dim) + " dims of each head rotate)");
  std::optional<RopeScaling> out;
  if (type.empty() || type == "default") {
    f.reject_unread();
    return out;
  }
  RopeScaling r;
  auto factor = [&](double fallback) {
    r.factor = f.number("factor", fallback);
    if (!(r.factor > 0)) f.fail_field("factor", "of " + key + " must be > 0");
  };
  auto original = [&] {
    r.original_max_position_embeddings =
        f.positive("original_max_position_embeddings", c.max_position_embeddings);
  };
  auto attention_factor = [&] {
    if (!f.has("attention_factor")) return;
    r.attention_factor = f.number("attention_factor", 0);
    if (!(*r.attention_factor > 0)) f.fail_field("attention_factor", "must be > 0");
  };
  if (type == "llama3") {
    r.type = RopeScaling::Type::llama3;
    factor(0);
    r.low_freq_factor = f.number("low_freq_factor", 0);
    r.high_freq_factor = f.number("high_freq_factor", 0);
    r.original_max_position_embeddings = f.positive("original_max_position_embeddings", 0);
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor))
      f.fail_field("high_freq_factor",
                   "of " + key + " must exceed low_freq_factor, and both be > 0");
  } else if (type == "linear") {
    r.type = RopeScaling::Type::linear;
    factor(0);
  } else if (type == "dynamic") {
    r.type = RopeScaling::Type::dynamic;
    factor(0);
  } else if (type == "yarn") {
    r.type = RopeScaling::Type::yarn;
    original();
    // No factor: the ratio of the context to the pretraining one (transformers).
    factor(double(c.max_position_embeddings) / double(r.original_max_position_embeddings));
    attention_factor();
    // transformers' `or`: 0 (or null) means the default.
    if (const double b = f.number("beta_fast", 0); b != 0) r.beta_fast = b;
    if (const double b = f.number("beta_slow", 0); b != 0) r.beta_slow = b;
    if (!(r.beta_fast > 0) || !(r.beta_slow > 0))
      f.fail_field("beta_fast", "and beta_slow of " + key + " must be > 0");
    r.mscale = f.number("mscale", 0);
    r.mscale_all_dim = f.number("mscale_all_dim", 0);
    r.truncate = f.boolean("truncate", true);
  } else if (type == "longrope") {
    r.type = RopeScaling::Type::longrope;
    original();
    factor(double(c.max_position_embeddings) / double(r.original_max_position_embeddings));
    attention_factor();
    r.short_factor = factor_list(f, "short_factor", rotary_dim / 2);
    r.long_factor = factor_list(f, "long_factor", rotary_dim / 2);
  } else {
    fail("models", file, ": field '", key, "' has type '", type,
         "', which kiln does not support (supported: default, linear, dynamic, yarn, longrope, "
         "llama3, or null for none)");
  }
  f.reject_unread();
  out = r;
  return out;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("models", path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("models", path, ": read error");
  return ss.str();
}

// An auto_map whose classes all come from configuration_<module>.py or
// modeling_<module>.py.
bool builtin_remote_code(const Json& map, const char* module) {
  if (!module || !map.is_object()) return false;
  const std::string m = module;
  for (const auto& [key, v] : map.items()) {
    if (!v.is_string()) return false;
    const std::string s = v.get<std::string>();
    if (s.rfind("configuration_" + m + ".", 0) != 0 && s.rfind("modeling_" + m + ".", 0) != 0)
      return false;
  }
  return true;
}

}  // namespace

namespace detail {

void read_llama_rope_fields(Fields& f, LlamaConfig& c, int64_t rotary_dim) {
  // transformers reads rope_scaling where both are given; kiln asks for one.
  if (f.has("rope_scaling") && f.has("rope_parameters") &&
      f.get("rope_scaling") != f.get("rope_parameters"))
    f.fail_field("rope_parameters", "and rope_scaling are both given and differ");
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (f.has(key)) c.rope_scaling = read_rope_scaling(f.get(key), f.file(), key, c, rotary_dim);
  f.ignore({"rope_scaling", "rope_parameters"});
}

void require_field(Fields& f, const std::string& key, bool fallback, bool needed, const char* why) {
  if (f.boolean(key, fallback) != needed) f.fail_field(key, why);
}

}  // namespace detail

ModelConfig parse_config(std::string_view text, const std::string& file) {
  const Json j = detail::parse_json_object(text, file);
  ModelConfig cfg;
  {
    Fields f(j, file, "config");
    cfg.model_type = f.string("model_type", "");
    if (cfg.model_type.empty())
      fail("models", file, ": field 'model_type' is missing: kiln cannot tell the architecture");
  }
  const Architecture* arch = detail::architecture_for_model_type(cfg.model_type);
  if (!arch)
    fail("models", file, ": field 'model_type' is '", cfg.model_type,
         "', an architecture kiln does not know (supported: ", detail::supported_model_types(),
         ")");
  {
    Fields f(j, file, "config");
    if (f.has("auto_map") && !builtin_remote_code(f.get("auto_map"), (*arch)->remote_code_module))
      f.fail_field("auto_map", "asks for custom model code, which kiln cannot run");
  }
  Fields f(j, file, cfg.model_type + " model");
  ignore_harmless(f);
  f.ignore("auto_map");  // checked above
  read_token_ids(f, cfg.generation);
  (*arch)->read_config(f, cfg);
  f.reject_unread();
  return cfg;
}

ModelConfig read_config(const std::string& path) { return parse_config(read_text(path), path); }

void parse_generation_config(std::string_view text, const std::string& file, GenerationConfig& g) {
  const Json j = detail::parse_json_object(text, file);
  Fields f(j, file, "generation config");
  read_token_ids(f, g);
  // Sampling defaults (Hugging Face's GenerationConfig names); the rest of the
  // file (max_length, pad_token_id, ...) changes nothing kiln computes.
  auto number = [&](const char* key, std::optional<float>& out) {
    if (!f.has(key)) return;
    const double v = f.number(key, 0);
    if (!std::isfinite(v)) f.fail_field(key, "must be a finite number");
    out = float(v);
  };
  if (f.has("do_sample")) g.do_sample = f.boolean("do_sample", false);
  number("temperature", g.temperature);
  number("top_p", g.top_p);
  number("min_p", g.min_p);
  number("repetition_penalty", g.repetition_penalty);
  if (f.has("top_k")) g.top_k = f.integer("top_k", 0);
}

namespace {

// The events of a shard index: nesting depth, and weight_map's keys in the
// file's order (a duplicate refused).
struct IndexScan : nlohmann::json_sax<nlohmann::json> {
  static constexpr int kMaxDepth = 16;
  const std::string& file;
  explicit IndexScan(const std::string& f) : file(f) {}
  std::vector<std::string> order;
  std::unordered_set<std::string> seen;
  std::string parent;  // the root key whose value is open
  int depth = 0;
  bool enter() {
    if (++depth > kMaxDepth)
      fail("models", file, ": JSON nests deeper than ", kMaxDepth, " levels");
    return true;
  }
  bool start_object(std::size_t) override { return enter(); }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return enter(); }
  bool end_array() override { return --depth, true; }
  bool key(string_t& k) override {
    if (depth == 1) parent = k;
    if (depth == 2 && parent == "weight_map") {
      if (!seen.insert(k).second)
        fail("models", file, ": field 'weight_map' lists '", k, "' twice");
      order.push_back(k);
    }
    return true;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    fail("models", file, ": not valid JSON (", e.what(), ")");
  }
};

}  // namespace

ShardIndex parse_shard_index(std::string_view text, const std::string& file) {
  // An index lists every tensor (an MoE checkpoint: ~18k): parsed into a
  // map-backed object without a parse callback (ordered_json looks up each key
  // it inserts in a list, and a callback makes the library scan the object
  // after every value: both quadratic). weight_map's order comes from a first
  // pass over the events.
  using MapJson = nlohmann::json;
  IndexScan scan(file);
  MapJson j;
  try {
    MapJson::sax_parse(text.begin(), text.end(), &scan);
    j = MapJson::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    fail("models", file, ": not valid JSON (", e.what(), ")");
  }
  if (!j.is_object()) fail("models", file, ": expected a JSON object");
  const auto it = j.find("weight_map");
  if (it == j.end() || !it->is_object())
    fail("models", file, ": field 'weight_map' is missing or not an object");
  ShardIndex idx;
  std::unordered_set<std::string> shards;
  for (const std::string& name : scan.order) {
    const MapJson& e = it->at(name);
    if (!e.is_string())
      fail("models", file, ": field 'weight_map' maps '", name, "' to ", e.dump(),
           ", not a file name");
    const std::string shard = e.get<std::string>();
    if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
      fail("models", file, ": field 'weight_map' maps '", name, "' to '", shard,
           "', which is not a file name in the model's directory");
    idx.weight_map.emplace_back(name, shard);
    if (shards.insert(shard).second) idx.shards.push_back(shard);
  }
  if (idx.weight_map.empty()) fail("models", file, ": field 'weight_map' is empty");
  return idx;
}

namespace detail {

Json rope_scaling_json(const RopeScaling& r) {
  Json j = {{"rope_type", rope_scaling_name(r.type)}, {"factor", r.factor}};
  using T = RopeScaling::Type;
  if (r.type == T::llama3) {
    j["low_freq_factor"] = r.low_freq_factor;
    j["high_freq_factor"] = r.high_freq_factor;
  }
  if (r.type == T::llama3 || r.type == T::yarn || r.type == T::longrope)
    j["original_max_position_embeddings"] = r.original_max_position_embeddings;
  if ((r.type == T::yarn || r.type == T::longrope) && r.attention_factor)
    j["attention_factor"] = *r.attention_factor;
  if (r.type == T::yarn) {
    j["beta_fast"] = r.beta_fast;
    j["beta_slow"] = r.beta_slow;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
    if (!r.truncate) j["truncate"] = false;
  }
  if (r.type == T::longrope) {
    j["short_factor"] = r.short_factor;
    j["long_factor"] = r.long_factor;
  }
  return j;
}

}  // namespace detail

std::string config_json(const ModelConfig& cfg) {
  Json j;
  const GenerationConfig& g = cfg.generation;
  detail::architecture_of(cfg)->write_config(cfg, j);
  if (g.bos_token_id >= 0) j["bos_token_id"] = g.bos_token_id;
  if (g.eos_token_ids.size() == 1) j["eos_token_id"] = g.eos_token_ids[0];
  if (g.eos_token_ids.size() > 1) j["eos_token_id"] = g.eos_token_ids;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace kiln::models
