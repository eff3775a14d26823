// What the Llama-family rows of architectures.def share (llama, phi3): the
// LlamaConfig fields of config.json and GGUF metadata they spell alike, RoPE
// scaling in both, and the hooks common to them (llama_family.cpp, config.cpp).
#pragma once
#include <optional>
#include <string>

#include "models/architecture.h"

namespace kiln::models::detail {

// config.json: sizes, norms, RoPE base, tied head, attention dropout, silu.
void read_llama_common(Fields& f, LlamaConfig& c);
// The checks every Llama-family config passes once read.
void check_llama_common(Fields& f, const LlamaConfig& c);
void write_llama_common(const LlamaConfig& c, Json& j);
// "rope_scaling" / "rope_parameters" (config.cpp); rotary_dim: the dims of a
// head RoPE turns (head_dim unless partial), whose half the longrope factor
// lists have.
void read_llama_rope_fields(Fields& f, LlamaConfig& c, int64_t rotary_dim);
Json rope_scaling_json(const RopeScaling& r);

// GGUF: the keys of llama.cpp's llama-like architectures (sizes, heads, norm
// epsilon, RoPE base; tied when there is no output.weight).
void read_gguf_llama_common(GgufMeta& m, LlamaConfig& c);
void write_gguf_llama_common(const LlamaConfig& c, const std::string& prefix, GgufWriter& w);
// rope.scaling.* keys: type linear or yarn (none: nullopt).
std::optional<RopeScaling> gguf_rope_scaling(GgufMeta& m, int64_t context);
void write_gguf_rope_scaling(const RopeScaling& r, const std::string& prefix, GgufWriter& w,
                             const std::string& path);
// token_embd, output_norm, output.
const NameMap& llama_top_gguf_names();
RecipeModel llama_recipe_model(const ModelConfig& cfg);
// Layers, embedding, tied head, builder (make_llama); the rest is the row's.
ArchHooks llama_family_hooks();

}  // namespace kiln::models::detail
