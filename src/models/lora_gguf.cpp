// LoRA adapters as GGUF files in llama.cpp's format (kiln/lora.h): metadata
// general.type "adapter", general.architecture (the base's), adapter.type
// "lora" and adapter.lora.alpha (f32); for each adapted weight W of the base,
// tensors "<W's GGUF name>.lora_a" (A, [r, in] in kiln's order, ggml ne
// {in, r}) and ".lora_b" (B, [out, r]). llama.cpp adds (alpha / r) * B A x
// (scale 1 when alpha is 0 or absent). Its "llama" files store q and k rows in
// the pair order of their RoPE (gguf_layout.h), so B's rows move the same way:
// the product B A then has the rows of the stored W.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <stdexcept>

#include "kiln/io.h"
#include "models/architecture.h"
#include "models/gguf_layout.h"
#include "models/lora_values.h"

namespace kiln::models::detail {
namespace {

constexpr const char* kA = ".lora_a";
constexpr const char* kB = ".lora_b";

struct Site {
  std::string path;  // kiln's module path
  const nn::LinearBase* layer = nullptr;
  Layout layout = Layout::same;
  int64_t heads = 0;
};

bool tied_head(const CausalLM& model, const std::string& path) {
  if (path != "lm_head") return false;
  const ModelConfig& c = model.config();
  return architecture_of(c)->tied_head(c);
}

// The GGUF name of the weight a Linear-like layer holds ("" for the tied head,
// which llama.cpp's files store only as token_embd).
std::string weight_name(const CausalLM& model, const std::string& path) {
  if (tied_head(model, path)) return "";
  return gguf_name(path + ".weight", model.config());
}

// Every Linear-like layer by the GGUF name of its weight.
std::map<std::string, Site> sites(const CausalLM& model) {
  std::map<std::string, Site> out;
  for (const auto& [p, l] : linear_layers(model)) {
    const std::string name = weight_name(model, p);
    if (name.empty()) continue;
    Site s{p, l};
    s.layout = layout_of(p + ".weight", model.config(), &s.heads);
    out.emplace(name, s);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string metadata_string(const GgufFile& f, const std::string& key, const std::string& want) {
  const GgufValue* v = f.find(key);
  if (!v)
    fail("models", f.path(), ": metadata '", key, "' is missing (a llama.cpp LoRA adapter has ",
         key, " = ", want, ")");
  return v->as_string();
}

// target_modules for the layers an adapter has: their leaf names ("q_proj")
// when those match exactly these layers, else their full Hugging Face paths.
void set_targets(const CausalLM& model, LoraValues& v) {
  std::set<std::string> adapted;
  nn::LoraConfig leaves;
  for (const LoraLayerValues& l : v.layers) {
    const std::string hf = hf_path(model, l.path);
    adapted.insert(hf);
    const std::string leaf = hf.substr(hf.rfind('.') + 1);
    auto& t = leaves.target_modules;
    if (std::find(t.begin(), t.end(), leaf) == t.end()) t.push_back(leaf);
  }
  bool exact = true;
  for (const auto& [p, l] : linear_layers(model)) {
    const std::string hf = hf_path(model, p);
    exact &= nn::lora_matches(leaves, hf) == (adapted.count(hf) > 0);
  }
  v.cfg.lora.target_modules =
      exact ? leaves.target_modules : std::vector<std::string>(adapted.begin(), adapted.end());
}

}  // namespace

LoraValues read_gguf_lora(const CausalLM& model, const std::string& path) {
  GgufFile f(path);
  const std::string type = metadata_string(f, "general.type", "adapter");
  if (type != "adapter")
    fail("models", path, ": metadata 'general.type' is '", type,
         "', not 'adapter': a model file, not a LoRA adapter?");
  const std::string arch = metadata_string(f, "general.architecture", arch_of(model.config()));
  if (arch != arch_of(model.config()))
    fail("models", path, ": metadata 'general.architecture' is '", arch,
         "' but the base model is '", arch_of(model.config()), "'");
  const std::string atype = metadata_string(f, "adapter.type", "lora");
  if (atype != "lora")
    fail("models", path, ": metadata 'adapter.type' is '", atype, "'; kiln loads LoRA adapters");
  double alpha = 0;
  if (const GgufValue* a = f.find("adapter.lora.alpha")) alpha = a->as_float();
  if (!std::isfinite(alpha)) fail("models", path, ": metadata 'adapter.lora.alpha' is not finite");
  for (const auto& [key, value] : f.metadata())
    if (key.rfind("adapter.", 0) == 0 && key != "adapter.type" && key != "adapter.lora.alpha")
      fail("models", path, ": metadata '", key,
           "' is not supported by kiln (it does not ignore settings it does not implement)");

  // Pair the tensors by the weight they adapt; check names, dtypes and shapes
  // before reading any data.
  const std::map<std::string, Site> by_name = sites(model);
  struct Pair {
    const GgufTensorInfo* a = nullptr;
    const GgufTensorInfo* b = nullptr;
  };
  std::map<std::string, Pair> pairs;
  for (const GgufTensorInfo& t : f.tensors()) {
    const bool is_a = ends_with(t.name, kA), is_b = ends_with(t.name, kB);
    if (!is_a && !is_b)
      fail("models", path, ": tensor '", t.name,
           "' is not a LoRA tensor (kiln loads '<weight>.lora_a' / '<weight>.lora_b' pairs)");
    const std::string w = t.name.substr(0, t.name.size() - 7);
    if (!by_name.count(w))
      fail("models", path, ": tensor '", t.name, "' adapts '", w, "', which is not a weight of a ",
           "Linear layer of the base model (", arch, ", ", model.config().model_type,
           "): another base model's adapter?");
    if (t.dtype == i32 && !t.quantized())
      fail("models", path, ": tensor '", t.name, "' is i32; LoRA weights are floats");
    if (t.shape.ndim() != 2)
      fail("models", path, ": tensor '", t.name, "' is ", t.shape.str(), "; LoRA weights are 2-D");
    (is_a ? pairs[w].a : pairs[w].b) = &t;
  }
  if (pairs.empty()) fail("models", path, ": the adapter has no tensors");
  LoraValues v;
  int64_t r = 0;
  for (const auto& [w, p] : pairs) {
    if (!p.a || !p.b)
      fail("models", path, ": tensor '", w, p.a ? kB : kA, "' is missing (the file has '", w,
           p.a ? kA : kB, "')");
    if (r == 0) r = p.a->shape[0];
    if (r < 1) fail("models", path, ": tensor '", p.a->name, "' is ", p.a->shape.str(), ": rank 0");
    const nn::LinearBase& l = *by_name.at(w).layer;
    const Shape want_a({r, l.in_features()}), want_b({l.out_features(), r});
    for (auto [t, want] : {std::pair{p.a, want_a}, {p.b, want_b}})
      if (t->shape != want)
        fail("models", path, ": tensor '", t->name, "' is ", t->shape.str(), " but the base's '", w,
             "' and rank ", r, " (of '", pairs.begin()->first, kA, "') imply ", want.str(),
             r == p.a->shape[0] ? "" : "; kiln loads adapters of one rank");
  }
  // Read, in the model's tree order.
  for (const auto& [p, l] : linear_layers(model)) {
    const std::string w = weight_name(model, p);
    const auto it = pairs.find(w);
    if (w.empty() || it == pairs.end()) continue;
    const Site& s = by_name.at(w);
    std::vector<float> b = gguf_dequantize(*it->second.b, f.read_bytes(it->second.b->name));
    if (s.layout == Layout::rope_pairs) b = reorder_rope_rows(b, s.heads, l->out_features(), false);
    v.layers.push_back(
        {p, l, gguf_dequantize(*it->second.a, f.read_bytes(it->second.a->name)), std::move(b)});
  }
  v.cfg.lora.r = r;
  // llama.cpp's scale is alpha / r, or 1 when alpha is 0 (or absent).
  v.cfg.lora.alpha = alpha == 0 ? float(r) : float(alpha);
  set_targets(model, v);
  return v;
}

void write_gguf_lora(const CausalLM& model, const std::string& path, const LoraValues& v) {
  const nn::LoraConfig& c = v.cfg.lora;
  // llama.cpp scales by alpha / r: rsLoRA's alpha / sqrt(r) is alpha * sqrt(r) / r.
  const double alpha = c.use_rslora ? double(c.alpha) * std::sqrt(double(c.r)) : double(c.alpha);
  if (alpha == 0)
    fail("models", path,
         ": lora_alpha 0 (scale 0) cannot be written: llama.cpp reads "
         "adapter.lora.alpha 0 as scale 1");
  GgufWriter w;
  w.set("general.architecture", arch_of(model.config()));
  w.set("general.type", std::string("adapter"));
  w.set("general.name", std::string("kiln LoRA adapter"));
  w.set("general.file_type", uint32_t(0));  // all f32
  w.set("adapter.type", std::string("lora"));
  w.set("adapter.lora.alpha", float(alpha));
  for (const LoraLayerValues& l : v.layers) {
    if (tied_head(model, l.path))
      fail("models", path, ": layer '", l.path,
           "' shares the token embedding's weight, which llama.cpp's adapters cannot adapt "
           "(train without lm_head in the targets)");
    const std::string name = weight_name(model, l.path);
    if (name.empty())
      fail("models", path, ": layer '", l.path, "' has no weight in llama.cpp's GGUF files");
    int64_t heads = 0;
    std::vector<float> b = l.b;
    if (layout_of(l.path + ".weight", model.config(), &heads) == Layout::rope_pairs)
      b = reorder_rope_rows(b, heads, l.layer->out_features(), true);
    auto add = [&](const std::string& n, const Shape& s, const std::vector<float>& x) {
      w.add_tensor_data(n, f32, s, {reinterpret_cast<const uint8_t*>(x.data()), x.size() * 4});
    };
    add(name + kA, Shape({c.r, l.layer->in_features()}), l.a);
    add(name + kB, Shape({l.layer->out_features(), c.r}), b);
  }
  w.save(path);
}

}  // namespace kiln::models::detail
