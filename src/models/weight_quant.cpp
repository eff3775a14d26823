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

std::optional<DType> quantized_weight_dtype(const ModelOptions& opt) {
  switch (opt.weight_dtype) {
    case ModelOptions::WeightDType::q8_0: return q8_0;
    case ModelOptions::WeightDType::q4_0: return q4_0;
    default: return std::nullopt;
  }
}

bool quantizes(const std::set<std::string>& linear, const std::string& name, const Tensor& param) {
  return param.ndim() == 2 && param.size(-1) % 32 == 0 && linear.count(name) != 0;
}

void freeze_quantized(nn::Module& model) {
  for (auto& [name, t] : model.named_parameters())
    if (is_quantized(t.dtype())) t.set_requires_grad(false);
}

}  // namespace kiln::models::detail
