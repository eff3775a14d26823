// config.json -> LlamaConfig / Gpt2Config. Each field is used, listed here as
// harmless, or an error naming it.
#include <cmath>
#include <fstream>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "kiln/models.h"
#include "models/json_fields.h"

namespace kiln::models {
namespace {

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
    f.fail_field(key, "must be a list of " + std::to_string(n) + " numbers (head_dim / 2)");
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
                                             const std::string& key, LlamaConfig& c) {
  if (!v.is_object()) fail("models", file, ": field '", key, "' must be an object or null");
  Fields f(v, file, key);
  std::string type = f.string("rope_type", "");
  const std::string legacy = f.string("type", "");
  if (type.empty()) type = legacy;
  if (!legacy.empty() && legacy != type)
    f.fail_field("type", "is '" + legacy + "' but rope_type is '" + type + "'");
  if (f.has("rope_theta")) c.rope_theta = f.number("rope_theta", 0);
  if (f.has("partial_rotary_factor") && f.number("partial_rotary_factor", 1) != 1.0)
    f.fail_field("partial_rotary_factor", "is not 1: kiln's Llama family rotates whole heads");
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
    r.short_factor = factor_list(f, "short_factor", c.head_dim / 2);
    r.long_factor = factor_list(f, "long_factor", c.head_dim / 2);
  } else {
    fail("models", file, ": field '", key, "' has type '", type,
         "', which kiln does not support (supported: default, linear, dynamic, yarn, longrope, "
         "llama3, or null for none)");
  }
  f.reject_unread();
  out = r;
  return out;
}

// "sliding_window" of Qwen2/Qwen3 applies only with use_sliding_window (and then
// only to some layers): kiln runs them with full attention or refuses.
void read_qwen_window(Fields& f) {
  if (f.boolean("use_sliding_window", false))
    f.fail_field("use_sliding_window",
                 "is true: kiln does not implement Qwen's per-layer sliding window");
  f.ignore({"sliding_window", "max_window_layers"});
  const Json& types = f.get("layer_types");
  if (types.is_null()) return;
  if (!types.is_array()) f.fail_field("layer_types", "must be a list");
  for (const Json& t : types)
    if (t != "full_attention")
      f.fail_field("layer_types", "lists " + t.dump() + ": kiln supports full_attention only");
}

void require(Fields& f, const std::string& key, bool fallback, bool needed, const char* why) {
  if (f.boolean(key, fallback) != needed) f.fail_field(key, why);
}

// Models whose HF code has no such biases: the fields may appear, but only false.
void no_bias_fields(Fields& f) {
  require(f, "attention_bias", false, false, "must be false: this architecture has no such biases");
  require(f, "mlp_bias", false, false, "must be false: this architecture has no such biases");
}

LlamaConfig read_llama(Fields& f, const std::string& type) {
  LlamaConfig c;
  c.model_type = type;
  c.vocab_size = f.positive("vocab_size", 0);
  c.hidden_size = f.positive("hidden_size", 0);
  c.intermediate_size = f.positive("intermediate_size", 0);
  c.num_hidden_layers = f.positive("num_hidden_layers", 0);
  c.num_attention_heads = f.positive("num_attention_heads", 0);
  c.num_key_value_heads = f.positive("num_key_value_heads", c.num_attention_heads);
  c.head_dim = f.positive("head_dim", c.hidden_size / c.num_attention_heads);
  c.max_position_embeddings = f.positive("max_position_embeddings", 2048);
  c.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  c.rope_theta = f.number("rope_theta", 10000.0);
  if (c.head_dim % 2 != 0)
    f.fail_field("head_dim", "(" + std::to_string(c.head_dim) + ") must be even for RoPE");
  c.tie_word_embeddings = f.boolean("tie_word_embeddings", false);
  c.attention_dropout = float(f.number("attention_dropout", 0.0));
  const std::string act = f.string("hidden_act", "silu");
  if (act != "silu") f.fail_field("hidden_act", "is '" + act + "': kiln's " + type + " uses silu");
  // transformers reads rope_scaling where both are given; kiln asks for one.
  if (f.has("rope_scaling") && f.has("rope_parameters") &&
      f.get("rope_scaling") != f.get("rope_parameters"))
    f.fail_field("rope_parameters", "and rope_scaling are both given and differ");
  for (const char* key : {"rope_parameters", "rope_scaling"})
    if (f.has(key)) c.rope_scaling = read_rope_scaling(f.get(key), f.file(), key, c);
  f.ignore({"rope_scaling", "rope_parameters"});
  if (type == "llama") {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.mlp_bias = f.boolean("mlp_bias", false);
    f.ignore("pretraining_tp");  // sliced matmuls in HF: the same function
  } else if (type == "mistral") {
    no_bias_fields(f);
    c.sliding_window = f.integer("sliding_window", 0);
    if (c.sliding_window < 0) f.fail_field("sliding_window", "must be positive or null");
  } else if (type == "qwen2") {
    c.qkv_bias = true;  // Qwen2 always has q/k/v biases (and no o_proj bias)
    no_bias_fields(f);
    read_qwen_window(f);
  } else if (type == "qwen3") {
    c.qkv_bias = c.o_bias = f.boolean("attention_bias", false);
    c.qk_norm = true;
    require(f, "mlp_bias", false, false, "is not supported by kiln's qwen3");
    read_qwen_window(f);
  }
  if (c.num_attention_heads % c.num_key_value_heads != 0)
    f.fail_field("num_key_value_heads", "(" + std::to_string(c.num_key_value_heads) +
                                            ") must divide num_attention_heads (" +
                                            std::to_string(c.num_attention_heads) + ")");
  if (!(c.rms_norm_eps > 0)) f.fail_field("rms_norm_eps", "must be > 0");
  if (!(c.rope_theta > 0)) f.fail_field("rope_theta", "must be > 0");
  if (!(c.attention_dropout >= 0 && c.attention_dropout < 1))
    f.fail_field("attention_dropout", "must be in [0, 1)");
  return c;
}

float dropout_field(Fields& f, const std::string& key) {
  const double p = f.number(key, 0.1);
  if (!(p >= 0 && p < 1)) f.fail_field(key, "must be in [0, 1)");
  return float(p);
}

Gpt2Config read_gpt2(Fields& f) {
  Gpt2Config c;
  c.vocab_size = f.positive("vocab_size", 50257);
  c.n_positions = f.positive("n_positions", 1024);
  c.n_embd = f.positive("n_embd", 768);
  c.n_layer = f.positive("n_layer", 12);
  c.n_head = f.positive("n_head", 12);
  c.n_inner = f.has("n_inner") ? f.positive("n_inner", 0) : 0;
  f.ignore("n_inner");
  const std::string act = f.string("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.gelu_tanh = true;
  } else if (act == "gelu") {
    c.gelu_tanh = false;
  } else {
    f.fail_field("activation_function",
                 "is '" + act + "': kiln's gpt2 supports gelu_new, gelu_pytorch_tanh and gelu");
  }
  c.layer_norm_epsilon = f.number("layer_norm_epsilon", 1e-5);
  if (!(c.layer_norm_epsilon > 0)) f.fail_field("layer_norm_epsilon", "must be > 0");
  c.resid_pdrop = dropout_field(f, "resid_pdrop");
  c.embd_pdrop = dropout_field(f, "embd_pdrop");
  c.attn_pdrop = dropout_field(f, "attn_pdrop");
  require(f, "scale_attn_weights", true, true, "must be true (kiln scales by 1/sqrt(head dim))");
  require(f, "scale_attn_by_inverse_layer_idx", false, false, "is not supported by kiln");
  require(f, "add_cross_attention", false, false, "is not supported by kiln (decoder only)");
  require(f, "tie_word_embeddings", true, true, "must be true (GPT-2's head is wte)");
  if (f.has("n_ctx") && f.integer("n_ctx", 0) != c.n_positions)
    f.fail_field("n_ctx", "differs from n_positions");
  f.ignore("n_ctx");
  // Upcasting only changes f16 runs (kiln computes in f32); the summary_* fields
  // and task_specific_params belong to other heads and pipelines.
  f.ignore({"reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
            "summary_proj_to_labels", "summary_first_dropout", "task_specific_params"});
  if (c.n_embd % c.n_head != 0)
    f.fail_field("n_head", "(" + std::to_string(c.n_head) + ") must divide n_embd (" +
                               std::to_string(c.n_embd) + ")");
  return c;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("models", path, ": cannot open");
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("models", path, ": read error");
  return ss.str();
}

}  // namespace

ModelConfig parse_config(std::string_view text, const std::string& file) {
  const Json j = detail::parse_json_object(text, file);
  ModelConfig cfg;
  {
    Fields f(j, file, "config");
    cfg.model_type = f.string("model_type", "");
    if (cfg.model_type.empty())
      fail("models", file, ": field 'model_type' is missing: kiln cannot tell the architecture");
    if (f.has("auto_map"))
      f.fail_field("auto_map", "asks for custom model code, which kiln cannot run");
  }
  const std::string& t = cfg.model_type;
  const bool llama = t == "llama" || t == "mistral" || t == "qwen2" || t == "qwen3";
  if (!llama && t != "gpt2")
    fail("models", file, ": field 'model_type' is '", t,
         "', an architecture kiln does not know (supported: llama, mistral, qwen2, qwen3, gpt2)");
  Fields f(j, file, t + " model");
  ignore_harmless(f);
  read_token_ids(f, cfg.generation);
  if (llama) {
    cfg.llama = read_llama(f, t);
  } else {
    cfg.gpt2 = read_gpt2(f);
  }
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

namespace {

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

}  // namespace

std::string config_json(const ModelConfig& cfg) {
  Json j;
  const GenerationConfig& g = cfg.generation;
  if (cfg.llama) {
    const LlamaConfig& c = *cfg.llama;
    if (!c.rope_freq_factors.empty())
      fail("models", "config_json: RoPE frequency factors (a GGUF file's rope_freqs) have no ",
           "config.json form; rope_scaling parameters do");
    static const std::map<std::string, std::string> arch = {{"llama", "LlamaForCausalLM"},
                                                            {"mistral", "MistralForCausalLM"},
                                                            {"qwen2", "Qwen2ForCausalLM"},
                                                            {"qwen3", "Qwen3ForCausalLM"}};
    j["architectures"] = {arch.at(c.model_type)};
    j["model_type"] = c.model_type;
    j["vocab_size"] = c.vocab_size;
    j["hidden_size"] = c.hidden_size;
    j["intermediate_size"] = c.intermediate_size;
    j["num_hidden_layers"] = c.num_hidden_layers;
    j["num_attention_heads"] = c.num_attention_heads;
    j["num_key_value_heads"] = c.num_key_value_heads;
    j["head_dim"] = c.head_dim;
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_position_embeddings;
    j["rms_norm_eps"] = c.rms_norm_eps;
    j["rope_theta"] = c.rope_theta;
    if (c.rope_scaling) {
      j["rope_scaling"] = rope_scaling_json(*c.rope_scaling);
    } else {
      j["rope_scaling"] = nullptr;
    }
    j["tie_word_embeddings"] = c.tie_word_embeddings;
    j["attention_dropout"] = c.attention_dropout;
    if (c.model_type == "llama") {
      j["attention_bias"] = c.qkv_bias;
      j["mlp_bias"] = c.mlp_bias;
    } else if (c.model_type == "mistral") {
      if (c.sliding_window > 0) {
        j["sliding_window"] = c.sliding_window;
      } else {
        j["sliding_window"] = nullptr;
      }
    } else {
      if (c.model_type == "qwen3") j["attention_bias"] = c.qkv_bias;
      j["use_sliding_window"] = false;
    }
  } else if (cfg.gpt2) {
    const Gpt2Config& c = *cfg.gpt2;
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["vocab_size"] = c.vocab_size;
    j["n_positions"] = c.n_positions;
    j["n_embd"] = c.n_embd;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    if (c.n_inner > 0) {
      j["n_inner"] = c.n_inner;
    } else {
      j["n_inner"] = nullptr;
    }
    j["activation_function"] = c.gelu_tanh ? "gelu_new" : "gelu";
    j["layer_norm_epsilon"] = c.layer_norm_epsilon;
    j["resid_pdrop"] = c.resid_pdrop;
    j["embd_pdrop"] = c.embd_pdrop;
    j["attn_pdrop"] = c.attn_pdrop;
  } else {
    fail("models", "config_json: the config has no architecture");
  }
  if (g.bos_token_id >= 0) j["bos_token_id"] = g.bos_token_id;
  if (g.eos_token_ids.size() == 1) j["eos_token_id"] = g.eos_token_ids[0];
  if (g.eos_token_ids.size() > 1) j["eos_token_id"] = g.eos_token_ids;
  j["torch_dtype"] = "float32";
  return j.dump(2) + "\n";
}

}  // namespace kiln::models
