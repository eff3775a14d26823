// LoRA adapters on Linear-like layers (kiln/nn/lora.h): the per-layer parts of
// nn::LinearBase and the model-level functions that find, add, switch and merge.
#include "kiln/nn/lora.h"

#include <algorithm>
#include <cmath>
#include <regex>

#include "kiln/nn.h"

namespace kiln::nn {

namespace {

// A weight's values as f32 and back: f16/bf16 weights (ModelOptions::weight_dtype
// stored / bf16) are merged in f32 and rounded back to their dtype.
std::vector<float> values_f32(Tensor W) {
  if (W.dtype() != f16 && W.dtype() != bf16) return W.get<float>();
  const std::vector<uint16_t> h = W.get<uint16_t>();
  std::vector<float> v(h.size());
  for (size_t i = 0; i < h.size(); ++i)
    v[i] = W.dtype() == f16 ? f16_to_f32(h[i]) : bf16_to_f32(h[i]);
  return v;
}

void set_values(Tensor W, const std::vector<float>& v) {
  if (W.dtype() != f16 && W.dtype() != bf16) return W.set(v);
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    h[i] = W.dtype() == f16 ? f32_to_f16(v[i]) : f32_to_bf16(v[i]);
  W.set(h);
}

// Every module of the tree outside adapters, with its path relative to root.
void walk(const Module& m, const std::string& path,
          std::vector<std::pair<std::string, Module*>>& out) {
  for (const auto& [n, c] : m.named_children()) {
    if (c->is_adapter()) continue;
    const std::string p = path.empty() ? n : path + "." + n;
    out.emplace_back(p, c);
    walk(*c, p, out);
  }
}

std::vector<std::pair<std::string, Module*>> modules_of(const Module& model) {
  std::vector<std::pair<std::string, Module*>> out;
  walk(model, "", out);
  return out;
}

// The layers with any adapter, in tree order.
std::vector<LinearBase*> adapted(const Module& model) {
  std::vector<LinearBase*> out;
  for (auto& [p, m] : modules_of(model))
    if (auto* l = dynamic_cast<LinearBase*>(m); l && !l->loras().empty()) out.push_back(l);
  return out;
}

}  // namespace

float LoraConfig::scaling() const {
  return use_rslora ? float(alpha / std::sqrt(double(r))) : float(double(alpha) / double(r));
}

bool lora_matches(const LoraConfig& cfg, const std::string& path) {
  if (!cfg.target_regex.empty()) {
    try {
      return std::regex_match(path, std::regex(cfg.target_regex));
    } catch (const std::regex_error& e) {
      fail("lora", "target regex '", cfg.target_regex, "' is not a valid regex (", e.what(), ")");
    }
  }
  for (const std::string& t : cfg.target_modules) {
    if (path == t) return true;
    if (path.size() > t.size() && path.compare(path.size() - t.size(), t.size(), t) == 0 &&
        path[path.size() - t.size() - 1] == '.')
      return true;
  }
  return false;
}

// ---- the per-layer parts ----
const LinearBase::Lora* LinearBase::find_lora(std::string_view name) const {
  for (const Lora& a : loras_)
    if (a.name == name) return &a;
  return nullptr;
}

LinearBase::Lora& LinearBase::add_lora(const std::string& name, int64_t r, float alpha,
                                       float dropout, bool use_rslora) {
  if (find_lora(name)) fail("lora", "layer '", path(), "' already has an adapter '", name, "'");
  if (r < 1) fail("lora", "layer '", path(), "': r must be >= 1, got ", r);
  if (!(dropout >= 0.0f && dropout < 1.0f))
    fail("lora", "layer '", path(), "': lora_dropout must be in [0, 1), got ", dropout);
  auto dict = [&](const char* n) -> ModuleDict& {
    for (const auto& [cn, c] : named_children())
      if (cn == n) return dynamic_cast<ModuleDict&>(*c);
    ModuleDict& d = add<ModuleDict>(n);
    d.mark_adapter();
    return d;
  };
  Lora a;
  a.name = name;
  a.r = r;
  a.alpha = alpha;
  a.dropout = dropout;
  a.use_rslora = use_rslora;
  LoraConfig c;
  c.r = r;
  c.alpha = alpha;
  c.use_rslora = use_rslora;
  a.scaling = c.scaling();
  a.A = &dict("lora_A").add<Linear>(name, in_, r, false);
  a.B = &dict("lora_B").add<Linear>(name, r, out_, false);
  a.drop = &dict("lora_dropout").add<Dropout>(name, dropout);
  loras_.push_back(a);
  return loras_.back();
}

void LinearBase::set_active_lora(const std::string& name) {
  if (merged_)
    fail("lora", "layer '", path(), "': adapter '", active_,
         "' is merged into the weights: unmerge_lora first");
  if (!name.empty() && !find_lora(name))
    fail("lora", "layer '", path(), "' has no adapter '", name, "'");
  active_ = name;
}

double MergeReport::rms_error() const {
  return values > 0 ? std::sqrt(sum_sq_error / double(values)) : 0.0;
}

void LinearBase::add_delta(const Lora& a, double sign, const MergeOptions& opt,
                           MergeReport* report) {
  Tensor W = weight();
  for (Tensor t : {W, a.A->weight(), a.B->weight()})
    if (!t.has_data()) fail("lora", "param '", t.name(), "' has no memory: allocate the model");
  std::vector<float> w = values_f32(W);
  const std::vector<float> A = a.A->weight().get<float>();  // [r, in]
  const std::vector<float> B = a.B->weight().get<float>();  // [out, r]
  const double s = sign * double(a.scaling);
  std::vector<double> row(static_cast<size_t>(in_));
  for (int64_t o = 0; o < out_; ++o) {
    std::fill(row.begin(), row.end(), 0.0);
    for (int64_t k = 0; k < a.r; ++k) {
      const double b = B[size_t(o * a.r + k)];
      const float* ak = A.data() + k * in_;
      for (int64_t i = 0; i < in_; ++i) row[size_t(i)] += b * ak[i];
    }
    for (int64_t i = 0; i < in_; ++i) {
      float& wi = fan_in_fan_out_ ? w[size_t(i * out_ + o)] : w[size_t(o * in_ + i)];
      wi = float(double(wi) + s * row[size_t(i)]);
    }
  }
  MergeReport none;
  MergeReport& r = report ? *report : none;
  // An f16/bf16 weight: the merged one kept f32, as a quantized one is below.
  // Rounded back to 16 bits it would lose most of a small delta (a bf16 step
  // at 0.02 is 1.2e-4, about a typical LoRA delta).
  if ((W.dtype() == f16 || W.dtype() == bf16) && sign > 0) {
    reallocate_parameter("weight", f32).set(w);
    r.kept_f32++;
    return;
  }
  if (!is_quantized(W.dtype()) || sign < 0) {
    set_values(W, w);  // (an unmerge re-quantizes a quantized weight: approximate)
    return;
  }
  if (!opt.requantize) {  // the merged weight in f32: no quantization error added
    reallocate_parameter("weight", f32).set(w);
    r.kept_f32++;
    return;
  }
  W.set(w);  // quantized again, in place
  const std::vector<float> back = W.get<float>();
  for (size_t i = 0; i < w.size(); ++i) {
    const double e = std::fabs(double(back[i]) - double(w[i]));
    r.max_error = std::max(r.max_error, e);
    r.sum_sq_error += e * e;
    r.max_abs_merged = std::max(r.max_abs_merged, double(std::fabs(w[i])));
  }
  r.values += int64_t(w.size());
  r.requantized++;
}

void LinearBase::merge_lora(const MergeOptions& opt, MergeReport* report) {
  if (merged_) fail("lora", "layer '", path(), "': adapter '", active_, "' is already merged");
  const Lora* a = find_lora(active_);
  if (!a) fail("lora", "layer '", path(), "' has no active adapter to merge");
  add_delta(*a, 1.0, opt, report);
  merged_ = true;
}

void LinearBase::unmerge_lora() {
  if (!merged_) fail("lora", "layer '", path(), "': no adapter is merged");
  add_delta(*find_lora(active_), -1.0);
  merged_ = false;
}

// ---- the model-level functions ----
namespace {

void check_new_adapter(const Module& model, const LoraConfig& cfg, const std::string& name) {
  if (name.empty() || name.find('.') != std::string::npos)
    fail("lora", "adapter name '", name, "' must be non-empty and contain no '.'");
  if (cfg.r < 1) fail("lora", "r must be >= 1, got ", cfg.r);
  for (const std::string& n : lora_adapters(model))
    if (n == name) fail("lora", "the model already has an adapter '", name, "'");
}

LinearBase& adaptable(const std::string& p, Module* m) {
  auto* l = dynamic_cast<LinearBase*>(m);
  if (!l)
    fail("lora", "target '", p, "' is a ", m->type_name(),
         "; LoRA adapts Linear layers (and Hugging Face's Conv1D)");
  if (l->lora_merged())
    fail("lora", "layer '", p, "' has a merged adapter: unmerge_lora before adding another");
  return *l;
}

void attach(Module& model, Backend& backend, const LoraConfig& cfg,
            const std::vector<LinearBase*>& targets, const std::string& name, uint64_t seed) {
  for (LinearBase* l : targets) {
    LinearBase::Lora& a = l->add_lora(name, cfg.r, cfg.alpha, cfg.dropout, cfg.use_rslora);
    a.target_modules = cfg.target_modules;  // as given: lora_config reports them
    a.target_regex = cfg.target_regex;
  }
  model.allocate(backend);  // the new params only: the others keep their memory
  for (LinearBase* l : targets) {
    const LinearBase::Lora& a = *l->find_lora(name);
    a.A->init(seed);  // Linear's default: kaiming_uniform(a=sqrt(5)), as PEFT's lora_A
    a.B->weight().fill_zero();
  }
  model.freeze();
  set_lora_adapter(model, name);
}

}  // namespace

std::vector<std::string> add_lora(Module& model, Backend& backend, const LoraConfig& cfg,
                                  const std::string& name, uint64_t seed) {
  check_new_adapter(model, cfg, name);
  if (cfg.target_modules.empty() && cfg.target_regex.empty())
    fail("lora", "no target modules: set target_modules (e.g. {\"q_proj\", \"v_proj\"})");
  std::vector<std::string> paths;
  std::vector<LinearBase*> targets;
  for (auto& [p, m] : modules_of(model)) {
    if (!lora_matches(cfg, p)) continue;
    targets.push_back(&adaptable(p, m));
    paths.push_back(p);
  }
  if (targets.empty()) {
    std::string want = cfg.target_regex;
    for (const std::string& t : cfg.target_modules) {
      if (!want.empty()) want.append(", ");
      want.append(t);
    }
    fail("lora", "no module of the model matches the targets (", want, ")");
  }
  attach(model, backend, cfg, targets, name, seed);
  return paths;
}

void add_lora_at(Module& model, Backend& backend, const LoraConfig& cfg,
                 const std::vector<std::string>& paths, const std::string& name, uint64_t seed) {
  check_new_adapter(model, cfg, name);
  if (paths.empty()) fail("lora", "adapter '", name, "': no layers to adapt");
  std::vector<LinearBase*> targets;
  for (const std::string& p : paths) targets.push_back(&adaptable(p, &model.child(p)));
  attach(model, backend, cfg, targets, name, seed);
}

LoraConfig lora_config(const Module& model, const std::string& name) {
  for (LinearBase* l : adapted(model))
    if (const LinearBase::Lora* a = l->find_lora(name)) {
      LoraConfig c;
      c.r = a->r;
      c.alpha = a->alpha;
      c.dropout = a->dropout;
      c.use_rslora = a->use_rslora;
      c.target_modules = a->target_modules;
      c.target_regex = a->target_regex;
      return c;
    }
  fail("lora", "the model has no adapter '", name, "'");
}

std::vector<std::string> lora_adapters(const Module& model) {
  std::vector<std::string> out;
  for (LinearBase* l : adapted(model))
    for (const LinearBase::Lora& a : l->loras())
      if (std::find(out.begin(), out.end(), a.name) == out.end()) out.push_back(a.name);
  return out;
}

std::vector<std::pair<std::string, LinearBase*>> lora_layers(const Module& model,
                                                             const std::string& name) {
  std::vector<std::pair<std::string, LinearBase*>> out;
  for (auto& [p, m] : modules_of(model))
    if (auto* l = dynamic_cast<LinearBase*>(m); l && l->find_lora(name)) out.emplace_back(p, l);
  return out;
}

void set_lora_adapter(Module& model, const std::string& name) {
  const std::vector<LinearBase*> layers = adapted(model);
  if (!name.empty()) {
    bool found = false;
    for (LinearBase* l : layers) found |= l->find_lora(name) != nullptr;
    if (!found) fail("lora", "the model has no adapter '", name, "'");
  }
  for (LinearBase* l : layers)
    if (l->lora_merged())
      fail("lora", "adapter '", l->active_lora(), "' is merged into layer '", l->path(),
           "': unmerge_lora first");
  for (LinearBase* l : layers) {
    l->set_active_lora(l->find_lora(name) ? name : std::string());
    for (const LinearBase::Lora& a : l->loras()) {
      a.A->set_requires_grad(a.name == name);
      a.B->set_requires_grad(a.name == name);
    }
  }
}

std::string active_lora_adapter(const Module& model) {
  for (LinearBase* l : adapted(model))
    if (!l->active_lora().empty()) return l->active_lora();
  return {};
}

MergeReport merge_lora(Module& model, const MergeOptions& opt) {
  const std::string name = active_lora_adapter(model);
  if (name.empty()) fail("lora", "no active adapter to merge");
  const std::vector<LinearBase*> layers = adapted(model);
  for (LinearBase* l : layers)
    if (l->lora_merged()) fail("lora", "adapter '", name, "' is already merged");
  MergeReport report;
  for (LinearBase* l : layers)
    if (!l->active_lora().empty()) l->merge_lora(opt, &report);
  return report;
}

void unmerge_lora(Module& model) {
  bool any = false;
  for (LinearBase* l : adapted(model))
    if (l->lora_merged()) {
      l->unmerge_lora();
      any = true;
    }
  if (!any) fail("lora", "no adapter is merged");
}

}  // namespace kiln::nn
