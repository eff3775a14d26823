// ModelOptions::weight_dtype q8_0 / q4_0: which params the loaders quantize
// (the weights of Linear-like layers), and what a loaded model does with them.
#pragma once
#include <optional>
#include <set>
#include <string>

#include "kiln/models.h"
#include "kiln/nn.h"

namespace kiln::models::detail {

// Names (as named_parameters() gives them) of the weights of every Linear-like
// layer (nn::LinearBase: projections, MLPs, an untied head) under `root`.
std::set<std::string> linear_weight_names(const nn::Module& root);

// q8_0 / q4_0 when opt asks to quantize Linear weights, nullopt otherwise.
std::optional<DType> quantized_weight_dtype(const ModelOptions& opt);

// True when `param` named `name` becomes `q` on load: a Linear weight whose rows
// are whole blocks (in_features % 32 == 0; others stay f32).
bool quantizes(const std::set<std::string>& linear, const std::string& name, const Tensor& param);

// Quantized params get no gradient (matmul reads them, the autodiff refuses
// them): they are frozen as they are loaded.
void freeze_quantized(nn::Module& model);

}  // namespace kiln::models::detail
