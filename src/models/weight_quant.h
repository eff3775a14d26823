// ModelOptions::weight_dtype q8_0 / q4_0: which params are quantized (the
// weights of Linear-like layers and the token embedding, tied to the head or
// not), and what a model does with them (frozen).
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

// The weights weight_dtype quantizes: linear_weight_names plus the token
// embedding (the head too when it is tied to it). Position embeddings (GPT-2's
// wpe), norms and biases are not in it.
std::set<std::string> quantizable_weight_names(const CausalLM& model);

// q8_0 / q4_0 when opt asks to quantize weights, nullopt otherwise.
std::optional<DType> quantized_weight_dtype(const ModelOptions& opt);

// True when `param` named `name` can become `q` on load: one of `names` whose
// rows are whole blocks of q (others stay f32).
bool quantizes(const std::set<std::string>& names, const std::string& name, const Tensor& param,
               DType q);

// Quantized params get no gradient (matmul and embedding read them, the
// autodiff refuses them): they are frozen as they are loaded.
void freeze_quantized(nn::Module& model);

// make_model: the params weight_dtype q8_0 / q4_0 quantizes get that dtype
// (before allocate, so init() writes quantized values) and are frozen.
void apply_weight_dtype(CausalLM& model, const ModelOptions& opt);

}  // namespace kiln::models::detail
