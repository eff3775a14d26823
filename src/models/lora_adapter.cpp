// LoRA adapters in PEFT's file layout (kiln/lora.h): adapter_config.json and
// adapter_model.safetensors, read and written.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "kiln/cpu.h"
#include "kiln/lora.h"
#include "kiln/safetensors.h"
#include "models/convert.h"
#include "models/file_text.h"
#include "models/json_fields.h"
#include "models/lora_values.h"

namespace kiln::models {
namespace {

namespace fs = std::filesystem;
using detail::Fields;
using detail::Json;

constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
constexpr const char* kPrefix = "base_model.model.";

// A field kiln does not implement: accepted only with PEFT's default (null,
// false, empty list or object).
void must_be_default(Fields& f, const char* key) {
  const Json& v = f.get(key);
  const bool dflt = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                    ((v.is_array() || v.is_object()) && v.empty());
  if (!dflt)
    f.fail_field(key, "is " + v.dump() + "; kiln supports only PEFT's default (" +
                          "null/false/empty) for it");
}

struct Target {
  std::string path;  // kiln's
  const nn::LinearBase* layer = nullptr;
  std::string name_a, name_b;  // the file's tensor names
};

// Every Linear-like layer outside adapters, in tree order.
void collect_linear(const nn::Module& m, const std::string& path,
                    std::vector<std::pair<std::string, nn::LinearBase*>>& out) {
  if (auto* l = dynamic_cast<const nn::LinearBase*>(&m))
    out.emplace_back(path, const_cast<nn::LinearBase*>(l));
  for (const auto& [n, c] : m.named_children())
    if (!c->is_adapter()) collect_linear(*c, path.empty() ? n : path + "." + n, out);
}

void write_atomically(const fs::path& target, const std::string& text) {
  const fs::path tmp = target.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    if (!out) fail("models", tmp.string(), ": write failed");
  }
  std::error_code ec;
  fs::rename(tmp, target, ec);
  if (ec) fail("models", target.string(), ": cannot write (", ec.message(), ")");
}

}  // namespace

LoraFileConfig parse_lora_config(std::string_view json, const std::string& file) {
  const Json j = detail::parse_json_object(json, file);
  Fields f(j, file, "adapter config");
  LoraFileConfig c;
  const std::string type = f.string("peft_type", "LORA");
  if (type != "LORA")
    f.fail_field("peft_type", "is '" + type + "'; kiln loads LoRA adapters (\"LORA\")");
  c.lora.r = f.positive("r", 8);
  c.lora.alpha = float(f.number("lora_alpha", 8.0));
  if (!std::isfinite(c.lora.alpha)) f.fail_field("lora_alpha", "does not fit a float");
  c.lora.dropout = float(f.number("lora_dropout", 0.0));
  if (!(c.lora.dropout >= 0.0f && c.lora.dropout < 1.0f))
    f.fail_field("lora_dropout", "must be in [0, 1)");
  c.lora.use_rslora = f.boolean("use_rslora", false);
  c.fan_in_fan_out = f.boolean("fan_in_fan_out", false);  // the layer's own layout decides
  c.base_model_name_or_path = f.string("base_model_name_or_path", "");
  const std::string bias = f.string("bias", "none");
  if (bias != "none")
    f.fail_field("bias", "is '" + bias + "'; kiln's adapters train no biases (\"none\")");
  const Json& t = f.get("target_modules");
  if (t.is_string()) {
    c.lora.target_regex = t.get<std::string>();
  } else if (t.is_array() && !t.empty()) {
    for (const Json& x : t) {
      if (!x.is_string()) f.fail_field("target_modules", "must list module names, got " + t.dump());
      c.lora.target_modules.push_back(x.get<std::string>());
    }
  } else {
    f.fail_field("target_modules", "must be a list of module names or a regex string, got " +
                                       (t.is_null() ? std::string("nothing") : t.dump()));
  }
  // Bookkeeping and initialisation-only settings: nothing kiln computes changes.
  f.ignore({"task_type", "inference_mode", "revision", "auto_mapping", "init_lora_weights",
            "megatron_config", "megatron_core", "loftq_config", "peft_version", "runtime_config",
            "eva_config", "corda_config", "qalora_group_size"});
  for (const char* k : {"modules_to_save", "layers_to_transform", "layers_pattern", "rank_pattern",
                        "alpha_pattern", "use_dora", "layer_replication", "exclude_modules",
                        "target_parameters", "trainable_token_indices", "lora_bias", "use_qalora"})
    must_be_default(f, k);
  f.reject_unread();
  return c;
}

std::string lora_config_json(const LoraFileConfig& c) {
  Json j;
  j["alpha_pattern"] = Json::object();
  j["auto_mapping"] = nullptr;
  if (c.base_model_name_or_path.empty()) j["base_model_name_or_path"] = nullptr;
  else j["base_model_name_or_path"] = c.base_model_name_or_path;
  j["bias"] = "none";
  j["fan_in_fan_out"] = c.fan_in_fan_out;
  j["inference_mode"] = true;
  j["init_lora_weights"] = true;
  j["layer_replication"] = nullptr;
  j["layers_pattern"] = nullptr;
  j["layers_to_transform"] = nullptr;
  j["loftq_config"] = Json::object();
  // PEFT writes lora_alpha as the int it usually is.
  if (std::floor(c.lora.alpha) == c.lora.alpha && std::fabs(c.lora.alpha) < 1e9f)
    j["lora_alpha"] = int64_t(c.lora.alpha);
  else j["lora_alpha"] = c.lora.alpha;
  j["lora_dropout"] = c.lora.dropout;
  j["megatron_config"] = nullptr;
  j["megatron_core"] = "megatron.core";
  j["modules_to_save"] = nullptr;
  j["peft_type"] = "LORA";
  j["r"] = c.lora.r;
  j["rank_pattern"] = Json::object();
  j["revision"] = nullptr;
  if (!c.lora.target_regex.empty()) j["target_modules"] = c.lora.target_regex;
  else j["target_modules"] = c.lora.target_modules;
  j["task_type"] = "CAUSAL_LM";
  j["use_dora"] = false;
  j["use_rslora"] = c.lora.use_rslora;
  return j.dump(2) + "\n";
}

namespace detail {

// The module path Hugging Face's model class gives a kiln module (GPT-2's
// GPT2LMHeadModel puts its layers under "transformer.").
std::string hf_path(const CausalLM& model, const std::string& path) {
  if (path == "lm_head") return path;  // the head sits beside "transformer."
  const std::string alt = model.alternate_name(path);
  return alt.empty() ? path : alt;
}

std::vector<std::pair<std::string, nn::LinearBase*>> linear_layers(const CausalLM& model) {
  std::vector<std::pair<std::string, nn::LinearBase*>> out;
  collect_linear(model, "", out);
  return out;
}

LoraValues lora_values(const CausalLM& model, const std::string& name) {
  const auto layers = nn::lora_layers(model, name);
  if (layers.empty()) fail("models", "the model has no adapter '", name, "' to save");
  LoraValues v;
  v.cfg.lora = nn::lora_config(model, name);
  for (const auto& [p, l] : layers) {
    const nn::LinearBase::Lora& a = *l->find_lora(name);
    v.layers.push_back({p, l, a.A->weight().get<float>(), a.B->weight().get<float>()});
    v.cfg.fan_in_fan_out |= l->fan_in_fan_out();
  }
  return v;
}

void add_lora_values(CausalLM& model, Backend& backend, const LoraValues& v,
                     const std::string& name) {
  std::vector<std::string> paths;
  for (const LoraLayerValues& l : v.layers) paths.push_back(l.path);
  nn::add_lora_at(model, backend, v.cfg.lora, paths, name);
  for (const LoraLayerValues& l : v.layers) {
    const nn::LinearBase::Lora& a = *l.layer->find_lora(name);
    a.A->weight().set(l.a);
    a.B->weight().set(l.b);
  }
}

LoraValues read_peft_lora(const CausalLM& model, const std::string& dir) {
  if (!fs::is_directory(dir)) fail("models", dir, ": not a directory");
  const std::string cfg_path = (fs::path(dir) / kConfigFile).string();
  const std::string st_path = (fs::path(dir) / kWeightsFile).string();
  if (!fs::exists(cfg_path)) fail("models", dir, ": ", kConfigFile, " is missing");
  if (!fs::exists(st_path))
    fail("models", dir, ": ", kWeightsFile, " is missing (kiln reads safetensors adapters)");
  LoraValues v;
  v.cfg = parse_lora_config(read_text_file(cfg_path), cfg_path);
  const LoraFileConfig& cfg = v.cfg;
  SafetensorsFile file(st_path);

  // The layers the config targets, matched as PEFT matches them (by the HF
  // module name), or by kiln's name.
  std::vector<Target> targets;
  for (const auto& [p, l] : linear_layers(model)) {
    const std::string hf = hf_path(model, p);
    if (!nn::lora_matches(cfg.lora, hf) && !nn::lora_matches(cfg.lora, p)) continue;
    Target t{p, l, kPrefix + hf + ".lora_A.weight", kPrefix + hf + ".lora_B.weight"};
    if (!file.find(t.name_a) && file.find(kPrefix + p + ".lora_A.weight")) {
      t.name_a = kPrefix + p + ".lora_A.weight";
      t.name_b = kPrefix + p + ".lora_B.weight";
    }
    targets.push_back(std::move(t));
  }
  if (targets.empty())
    fail("models", cfg_path, ": field 'target_modules' matches no Linear layer of the model (",
         model.type_name(), ")");

  // Check every tensor before anything is read.
  std::map<std::string, bool> used;
  auto check = [&](const std::string& tname, int64_t rows, int64_t cols) {
    const TensorInfo* ti = file.find(tname);
    if (!ti)
      fail("models", st_path, ": tensor '", tname, "' is missing (", kConfigFile,
           " targets that layer)");
    if (ti->file_dtype != "F32" && ti->file_dtype != "F16" && ti->file_dtype != "BF16")
      fail("models", st_path, ": tensor '", tname, "' is ", ti->file_dtype,
           "; kiln loads F32, F16 and BF16 adapters");
    if (ti->dims != std::vector<int64_t>{rows, cols})
      fail("models", st_path, ": tensor '", tname, "' is ", dims_str(ti->dims),
           " but r = ", cfg.lora.r, " and the layer imply [", rows, ", ", cols, "]");
    used[tname] = true;
  };
  for (const Target& t : targets) {
    check(t.name_a, cfg.lora.r, t.layer->in_features());
    check(t.name_b, t.layer->out_features(), cfg.lora.r);
  }
  for (const TensorInfo& ti : file.tensors())
    if (!used.count(ti.name))
      fail("models", st_path, ": tensor '", ti.name, "' is not a LoRA weight of a layer ",
           kConfigFile, " targets (kiln loads lora_A / lora_B weights only)");

  auto values = [&](const std::string& tname) {
    return detail::to_f32(file.read_bytes(tname), file.find(tname)->dtype);
  };
  for (const Target& t : targets)
    v.layers.push_back({t.path, t.layer, values(t.name_a), values(t.name_b)});
  return v;
}

void write_peft_lora(const CausalLM& model, const std::string& dir, const LoraValues& v) {
  // Host tensors for the safetensors writer.
  Context ctx;
  std::vector<NamedTensor> tensors;
  const int64_t r = v.cfg.lora.r;
  for (const LoraLayerValues& l : v.layers) {
    const std::string base = kPrefix + hf_path(model, l.path);
    tensors.push_back({base + ".lora_A.weight", ctx.tensor(f32, {r, l.layer->in_features()})});
    tensors.push_back({base + ".lora_B.weight", ctx.tensor(f32, {l.layer->out_features(), r})});
  }
  CpuBackend cpu(1);
  const auto buffer = allocate_tensors(ctx, cpu);
  for (size_t i = 0; i < v.layers.size(); ++i) {
    tensors[2 * i].tensor.set(v.layers[i].a);
    tensors[2 * i + 1].tensor.set(v.layers[i].b);
  }
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("models", dir, ": cannot create the directory (", ec.message(), ")");
  save_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
  write_atomically(fs::path(dir) / kConfigFile, lora_config_json(v.cfg));
}

}  // namespace detail

namespace {

bool is_gguf_file(const std::string& path) {
  return fs::path(path).extension() == ".gguf" && !fs::is_directory(path);
}

}  // namespace

LoraFileConfig load_lora(CausalLM& model, Backend& backend, const std::string& path,
                         const std::string& name) {
  if (!fs::exists(path))
    fail("models", path, ": no such adapter (a PEFT directory or a .gguf file)");
  const detail::LoraValues v = is_gguf_file(path) ? detail::read_gguf_lora(model, path)
                                                  : detail::read_peft_lora(model, path);
  detail::add_lora_values(model, backend, v, name);
  return v.cfg;
}

void save_lora(const CausalLM& model, const std::string& dir, const std::string& name,
               const std::string& base_model_name_or_path) {
  detail::LoraValues v = detail::lora_values(model, name);
  v.cfg.base_model_name_or_path = base_model_name_or_path;
  detail::write_peft_lora(model, dir, v);
}

void save_lora_gguf(const CausalLM& model, const std::string& path, const std::string& name) {
  detail::write_gguf_lora(model, path, detail::lora_values(model, name));
}

void convert_lora(const std::string& in, const std::string& out, const std::string& base_model) {
  if (!fs::exists(base_model))
    fail("models", base_model, ": no such base model (a Hugging Face directory or a .gguf file)");
  const ModelConfig cfg = fs::is_directory(base_model)
                              ? read_config((fs::path(base_model) / "config.json").string())
                              : read_gguf_config(base_model);
  Context ctx;
  const std::unique_ptr<CausalLM> model = make_model(ctx, cfg);  // layers only: no memory
  if (!fs::exists(in)) fail("models", in, ": no such adapter (a PEFT directory or a .gguf file)");
  detail::LoraValues v =
      is_gguf_file(in) ? detail::read_gguf_lora(*model, in) : detail::read_peft_lora(*model, in);
  if (fs::path(out).extension() == ".gguf") {
    detail::write_gguf_lora(*model, out, v);
  } else {
    if (v.cfg.base_model_name_or_path.empty()) v.cfg.base_model_name_or_path = base_model;
    detail::write_peft_lora(*model, out, v);
  }
}

}  // namespace kiln::models
