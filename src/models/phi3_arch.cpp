// Phi-3 / Phi-4's row of architectures.def (model_type phi3, GGUF phi3):
// config.json fields, GGUF metadata and tensor names. Its modules are the Llama
// family's (llama.cpp) with fused_projections: q, k and v as one qkv_proj and
// gate and up as one gate_up_proj, kept fused as both its Hugging Face files
// and llama.cpp's (attn_qkv, ffn_up) store them; partial rotary
// (partial_rotary_factor) and longrope's short/long factors are LlamaConfig's.
#include <cmath>
#include <string>

#include "models/architecture.h"
#include "models/convert.h"
#include "models/llama_family.h"
#include "models/rope.h"

namespace kiln::models::detail {
namespace {

bool phi3_is_longrope(const LlamaConfig& c) {
  return c.rope_scaling && c.rope_scaling->type == RopeScaling::Type::longrope;
}

void phi3_read_config(Fields& f, ModelConfig& cfg) {
  LlamaConfig c;
  c.model_type = cfg.model_type;
  c.fused_projections = true;
  read_llama_common(f, c);
  // transformers: int(head_dim * partial_rotary_factor) dims rotate.
  const double partial = f.number("partial_rotary_factor", 1.0);
  if (!(partial > 0 && partial <= 1)) f.fail_field("partial_rotary_factor", "must be in (0, 1]");
  const int64_t rotary = int64_t(std::floor(double(c.head_dim) * partial + 1e-9));
  if (rotary < 2 || rotary % 2 != 0)
    f.fail_field("partial_rotary_factor", "gives " + std::to_string(rotary) + " rotary dims of " +
                                              std::to_string(c.head_dim) + ": must be even, >= 2");
  c.rotary_dim = rotary == c.head_dim ? 0 : rotary;
  read_llama_rope_fields(f, c, c.rope_dims());
  // Phi-3 keeps the pretraining context at the top level; transformers' longrope
  // then takes it, and max_position_embeddings / it as the factor.
  if (f.has("original_max_position_embeddings")) {
    const int64_t original = f.positive("original_max_position_embeddings", 0);
    if (phi3_is_longrope(c)) {
      c.rope_scaling->original_max_position_embeddings = original;
      c.rope_scaling->factor = double(c.max_position_embeddings) / double(original);
    }
  }
  f.ignore("original_max_position_embeddings");
  c.sliding_window = f.integer("sliding_window", 0);
  if (c.sliding_window < 0) f.fail_field("sliding_window", "must be positive or null");
  for (const char* key : {"resid_pdrop", "embd_pdrop"})
    if (f.number(key, 0.0) != 0.0) f.fail_field(key, "must be 0: kiln's phi3 has no such dropout");
  for (const char* key : {"attention_bias", "mlp_bias", "lm_head_bias"})
    require_field(f, key, false, false, "must be false: Phi-3 has no such biases");
  // Phi-4-mini's config carries its own code's settings; transformers' phi3
  // ignores them, which is right for these values only (every layer full
  // attention, no interpolation).
  if (f.has("full_attn_mod") && f.integer("full_attn_mod", 1) != 1)
    f.fail_field("full_attn_mod", "must be 1 (every layer attends to all positions)");
  if (f.has("interpolate_factor") && f.number("interpolate_factor", 1) != 1)
    f.fail_field("interpolate_factor", "must be 1");
  f.ignore({"full_attn_mod", "interpolate_factor"});
  check_llama_common(f, c);
  cfg.llama = c;
}

void phi3_write_config(const ModelConfig& cfg, Json& j) {
  const LlamaConfig& c = *cfg.llama;
  j["architectures"] = {"Phi3ForCausalLM"};
  write_llama_common(c, j);
  j["partial_rotary_factor"] = double(c.rope_dims()) / double(c.head_dim);
  if (phi3_is_longrope(c))
    j["original_max_position_embeddings"] = c.rope_scaling->original_max_position_embeddings;
  if (c.sliding_window > 0) {
    j["sliding_window"] = c.sliding_window;
  } else {
    j["sliding_window"] = nullptr;
  }
  j["resid_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
}

// The factor tensors of longrope: rotary dims / 2 f32 values each.
std::vector<double> phi3_factor_tensor(const GgufFile& f, const std::string& name, int64_t n) {
  const GgufTensorInfo* t = f.find_tensor(name);
  if (t->dtype != f32 || t->quantized() || t->shape.numel() != n)
    fail("models", f.path(), ": tensor '", name, "' must be f32 [", n, "] (rotary dims / 2), got ",
         dtype_name(t->dtype), " ", t->shape.str());
  const std::vector<float> v = to_f32(f.read_bytes(name), f32);
  for (float x : v)
    if (!(x > 0)) fail("models", f.path(), ": tensor '", name, "' holds ", x, ", not > 0");
  return {v.begin(), v.end()};
}

// llama.cpp's phi3: rope.dimension_count the rotary dims, longrope as the
// rope_factors_long/short tensors with rope.scaling.original_context_length
// and rope.scaling.attn_factor, attention.sliding_window (0: none).
void phi3_read_gguf(GgufMeta& m, ModelConfig& cfg) {
  const GgufFile& f = m.file();
  LlamaConfig c;
  c.model_type = "phi3";
  c.fused_projections = true;
  read_gguf_llama_common(m, c);
  const int64_t rotary = m.integer("rope.dimension_count", c.head_dim);
  if (rotary > c.head_dim || rotary % 2 != 0)
    m.fail_key("rope.dimension_count",
               "must be even and at most the head dim (" + std::to_string(c.head_dim) + ")");
  c.rotary_dim = rotary == c.head_dim ? 0 : rotary;
  if (const GgufValue* w = m.find("attention.sliding_window")) c.sliding_window = w->as_int();
  if (c.sliding_window < 0) m.fail_key("attention.sliding_window", "must be >= 0");
  const int64_t original =
      m.integer("rope.scaling.original_context_length", c.max_position_embeddings);
  const GgufValue* attn = m.find("rope.scaling.attn_factor");
  const bool lf = f.find_tensor("rope_factors_long.weight") != nullptr,
             sf = f.find_tensor("rope_factors_short.weight") != nullptr;
  if (lf != sf)
    fail("models", f.path(), ": tensors 'rope_factors_long.weight' and ",
         "'rope_factors_short.weight' come together (longrope), the file has one");
  if (lf) {
    RopeScaling r;
    r.type = RopeScaling::Type::longrope;
    r.original_max_position_embeddings = original;
    r.factor = double(c.max_position_embeddings) / double(original);
    if (attn) r.attention_factor = attn->as_float();
    if (r.attention_factor && !(*r.attention_factor > 0))
      m.fail_key("rope.scaling.attn_factor", "must be > 0");
    r.long_factor = phi3_factor_tensor(f, "rope_factors_long.weight", c.rope_dims() / 2);
    r.short_factor = phi3_factor_tensor(f, "rope_factors_short.weight", c.rope_dims() / 2);
    c.rope_scaling = r;
  } else if (attn && attn->as_float() != 1.0) {
    m.fail_key("rope.scaling.attn_factor",
               "is not 1 but the file has no longrope factor tensors: kiln does not scale plain "
               "RoPE");
  }
  cfg.model_type = c.model_type;
  cfg.llama = c;
}

void phi3_write_gguf(const ModelConfig& cfg, GgufWriter& w, const std::string& path) {
  const LlamaConfig& c = *cfg.llama;
  const std::string k = "phi3.";
  write_gguf_llama_common(c, k, w);
  w.set(k + "rope.dimension_count", uint32_t(c.rope_dims()));
  w.set(k + "attention.sliding_window", uint32_t(c.sliding_window));
  if (!c.rope_scaling) return;
  if (!phi3_is_longrope(c))
    fail("models", path, ": rope scaling '", rope_scaling_name(c.rope_scaling->type),
         "' has no phi3 GGUF form (llama.cpp's phi3 files carry longrope only)");
  const RopeScaling& r = *c.rope_scaling;
  w.set(k + "rope.scaling.original_context_length", uint32_t(r.original_max_position_embeddings));
  w.set(k + "rope.scaling.attn_factor", float(rope_attention_factor(c)));
  for (const auto& [name, values] : {std::pair{"rope_factors_long.weight", &r.long_factor},
                                     std::pair{"rope_factors_short.weight", &r.short_factor}}) {
    const std::vector<float> v(values->begin(), values->end());
    w.add_tensor_data(name, f32, {int64_t(v.size())},
                      {reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4});
  }
}

std::string phi3_gguf_name(const std::string& hf) {
  static const NameMap layer = {
      {"input_layernorm", "attn_norm"},    {"self_attn.qkv_proj", "attn_qkv"},
      {"self_attn.o_proj", "attn_output"}, {"post_attention_layernorm", "ffn_norm"},
      {"mlp.gate_up_proj", "ffn_up"},      {"mlp.down_proj", "ffn_down"}};
  return mapped_gguf_name(hf, "model.layers.", llama_top_gguf_names(), layer);
}

}  // namespace

const ArchHooks& arch_phi3() {
  static const ArchHooks h = [] {
    ArchHooks a = llama_family_hooks();
    a.read_config = phi3_read_config;
    a.write_config = phi3_write_config;
    a.gguf_arch = [](const ModelConfig&) { return std::string("phi3"); };
    a.read_gguf = phi3_read_gguf;
    a.write_gguf = phi3_write_gguf;
    a.gguf_extra_tensors = {"rope_factors_long.weight", "rope_factors_short.weight"};
    // The hub's Phi-3 directories ship a copy of the code transformers has built in.
    a.remote_code_module = "phi3";
    a.gguf_name = phi3_gguf_name;
    // llama.cpp's phi3 rotates the two halves of the rotary dims, as HF: no reordering.
    a.layout_of = [](const std::string&, const ModelConfig&, int64_t*) { return Layout::same; };
    return a;
  }();
  return h;
}

}  // namespace kiln::models::detail
