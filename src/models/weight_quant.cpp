#include "models/weight_quant.h"

namespace kiln::models::detail {
namespace {

void collect(const nn::Module& m, const std::string& prefix, std::set<std::string>& out) {
  if (dynamic_cast<const nn::LinearBase*>(&m)) out.insert(prefix + "weight");
  for (const auto& [name, child] : m.named_children()) collect(*child, prefix + name + ".", out);
}

}  // namespace

std::set<std::string> linear_weight_names(const nn::Module& root) {
  std::set<std::string> out;
  collect(root, "", out);
  return out;
}

std::set<std::string> quantizable_weight_names(const CausalLM& model) {
  std::set<std::string> out = linear_weight_names(model);
  // The token embedding (gathered by embedding(), read by the tied head's matmul).
  out.insert(model.config().gpt2 ? "wte.weight" : "model.embed_tokens.weight");
  return out;
}

std::optional<DType> quantized_weight_dtype(const ModelOptions& opt) {
  switch (opt.weight_dtype) {
    case ModelOptions::WeightDType::q8_0: return q8_0;
    case ModelOptions::WeightDType::q4_0: return q4_0;
    default: return std::nullopt;
  }
}

bool quantizes(const std::set<std::string>& names, const std::string& name, const Tensor& param) {
  return param.ndim() == 2 && param.size(-1) % 32 == 0 && names.count(name) != 0;
}

void freeze_quantized(nn::Module& model) {
  for (auto& [name, t] : model.named_parameters())
    if (is_quantized(t.dtype())) t.set_requires_grad(false);
}

void apply_weight_dtype(CausalLM& model, const ModelOptions& opt) {
  const std::optional<DType> q = quantized_weight_dtype(opt);
  if (!q) return;
  const std::set<std::string> names = quantizable_weight_names(model);
  for (const auto& [name, t] : model.named_base_parameters())
    if (quantizes(names, name, t)) model.set_parameter_dtype(name, *q).set_requires_grad(false);
}

}  // namespace kiln::models::detail
