#include "models/weight_quant.h"

#include "models/architecture.h"

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
  out.insert(architecture_of(model.config())->embedding);
  return out;
}

std::optional<DType> quantized_weight_dtype(const ModelOptions& opt) {
  switch (opt.weight_dtype) {
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  KILN_QUANT_WEIGHT_CASE_##matmul(name)
#define KILN_QUANT_WEIGHT_CASE_qmatmul(name) \
  case ModelOptions::WeightDType::name:      \
    return DType::name;
#define KILN_QUANT_WEIGHT_CASE_dequant(name)
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
#undef KILN_QUANT_WEIGHT_CASE_qmatmul
#undef KILN_QUANT_WEIGHT_CASE_dequant
    default: return std::nullopt;
  }
}

namespace {
std::optional<ModelOptions::WeightDType> weight_dtype_of(DType t) {
  switch (t) {
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  KILN_QUANT_WEIGHT_OF_##matmul(name)
#define KILN_QUANT_WEIGHT_OF_qmatmul(name) \
  case DType::name:                        \
    return ModelOptions::WeightDType::name;
#define KILN_QUANT_WEIGHT_OF_dequant(name)
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
#undef KILN_QUANT_WEIGHT_OF_qmatmul
#undef KILN_QUANT_WEIGHT_OF_dequant
    default: return std::nullopt;
  }
}
}  // namespace

bool quantizes(const std::set<std::string>& names, const std::string& name, const Tensor& param,
               DType q) {
  return param.ndim() == 2 && param.size(-1) % dtype_block_elems(q) == 0 && names.count(name) != 0;
}

void freeze_quantized(nn::Module& model) {
  for (auto& [name, t] : model.named_parameters())
    if (is_quantized(t.dtype())) t.set_requires_grad(false);
}

void apply_weight_dtype(CausalLM& model, const ModelOptions& opt) {
  const std::optional<DType> q = quantized_weight_dtype(opt);
  if (!q) return;
  const std::set<std::string> names = quantizable_weight_names(model);
  std::vector<std::pair<std::string, DType>> changes;
  for (const auto& [name, t] : model.named_base_parameters())
    if (quantizes(names, name, t, *q)) changes.emplace_back(name, *q);
  for (Tensor t : model.set_parameter_dtypes(changes)) t.set_requires_grad(false);
}

}  // namespace kiln::models::detail

namespace kiln::models {

std::optional<ModelOptions::WeightDType> quantized_weight_dtype_named(std::string_view name) {
  for (const QuantType& q : kQuantTypes)
    if (q.matmul_reads && name == q.name) return detail::weight_dtype_of(q.dtype);
  return std::nullopt;
}

std::vector<std::string> quantized_weight_dtype_names() {
  std::vector<std::string> out;
  for (const QuantType& q : kQuantTypes)
    if (q.matmul_reads) out.emplace_back(q.name);
  return out;
}

}  // namespace kiln::models
