// GPT-2's row of architectures.def (model_type gpt2, GGUF gpt2): config.json
// fields, GGUF metadata and tensor names, Conv1D weights [in, out] written
// [out, in]; its modules are in gpt2.cpp.
#include <string>

#include "models/architecture.h"

namespace kiln::models::detail {
namespace {

float gpt2_dropout_field(Fields& f, const std::string& key) {
  const double p = f.number(key, 0.1);
  if (!(p >= 0 && p < 1)) f.fail_field(key, "must be in [0, 1)");
  return float(p);
}
Gpt2Config gpt2_read_gpt2(Fields& f) {
  Gpt2Config c;
  c.vocab_size = f.positive("vocab_size", 50257);
  c.n_positions = f.positive("n_positions", 1024);
  c.n_embd = f.positive("n_embd", 768);
  c.n_layer = f.positive("n_layer", 12);
  c.n_head = f.positive("n_head", 12);
  c.n_inner = f.has("n_inner") ? f.positive("n_inner", 0) : 0;
  f.ignore("n_inner");
  const std::string act = f.string("activation_function", "gelu_new");
  if (act == "gelu_new" || act == "gelu_pytorch_tanh") {
    c.gelu_tanh = true;
  } else if (act == "gelu") {
    c.gelu_tanh = false;
  } else {
    f.fail_field("activation_function",
                 "is '" + act + "': kiln's gpt2 supports gelu_new, gelu_pytorch_tanh and gelu");
  }
  c.layer_norm_epsilon = f.number("layer_norm_epsilon", 1e-5);
  if (!(c.layer_norm_epsilon > 0)) f.fail_field("layer_norm_epsilon", "must be > 0");
  c.resid_pdrop = gpt2_dropout_field(f, "resid_pdrop");
  c.embd_pdrop = gpt2_dropout_field(f, "embd_pdrop");
  c.attn_pdrop = gpt2_dropout_field(f, "attn_pdrop");
  require_field(f, "scale_attn_weights", true, true,
                "must be true (kiln scales by 1/sqrt(head dim))");
  require_field(f, "scale_attn_by_inverse_layer_idx", false, false, "is not supported by kiln");
  require_field(f, "add_cross_attention", false, false, "is not supported by kiln (decoder only)");
  require_field(f, "tie_word_embeddings", true, true, "must be true (GPT-2's head is wte)");
  if (f.has("n_ctx") && f.integer("n_ctx", 0) != c.n_positions)
    f.fail_field("n_ctx", "differs from n_positions");
  f.ignore("n_ctx");
  // Upcasting only changes f16 runs (kiln computes in f32); the summary_* fields
  // and task_specific_params belong to other heads and pipelines.
  f.ignore({"reorder_and_upcast_attn", "summary_type", "summary_use_proj", "summary_activation",
            "summary_proj_to_labels", "summary_first_dropout", "task_specific_params"});
  if (c.n_embd % c.n_head != 0)
    f.fail_field("n_head", "(" + std::to_string(c.n_head) + ") must divide n_embd (" +
                               std::to_string(c.n_embd) + ")");
  return c;
}

void gpt2_read_config(Fields& f, ModelConfig& cfg) { cfg.gpt2 = gpt2_read_gpt2(f); }

void gpt2_write_config(const ModelConfig& cfg, Json& j) {
  const Gpt2Config& c = *cfg.gpt2;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["vocab_size"] = c.vocab_size;
  j["n_positions"] = c.n_positions;
  j["n_embd"] = c.n_embd;
  j["n_layer"] = c.n_layer;
  j["n_head"] = c.n_head;
  if (c.n_inner > 0) {
    j["n_inner"] = c.n_inner;
  } else {
    j["n_inner"] = nullptr;
  }
  j["activation_function"] = c.gelu_tanh ? "gelu_new" : "gelu";
  j["layer_norm_epsilon"] = c.layer_norm_epsilon;
  j["resid_pdrop"] = c.resid_pdrop;
  j["embd_pdrop"] = c.embd_pdrop;
  j["attn_pdrop"] = c.attn_pdrop;
}

void gpt2_read_gguf(GgufMeta& m, ModelConfig& cfg) {
  Gpt2Config g;
  g.vocab_size = gguf_vocab_size(m);
  g.n_positions = m.integer("context_length");
  g.n_embd = m.integer("embedding_length");
  g.n_layer = m.integer("block_count");
  g.n_head = m.integer("attention.head_count");
  const int64_t ff = m.integer("feed_forward_length", 4 * g.n_embd);
  g.n_inner = ff == 4 * g.n_embd ? 0 : ff;
  g.layer_norm_epsilon = m.number("attention.layer_norm_epsilon", 1e-5);
  g.resid_pdrop = g.embd_pdrop = g.attn_pdrop = 0.0f;  // GGUF has no dropout: inference
  cfg.model_type = "gpt2";
  cfg.gpt2 = g;
}

void gpt2_write_gguf(const ModelConfig& cfg, GgufWriter& w, const std::string&) {
  const Gpt2Config& c = *cfg.gpt2;
  auto u32 = [](int64_t x) { return GgufValue(uint32_t(x)); };
  w.set("gpt2.context_length", u32(c.n_positions));
  w.set("gpt2.embedding_length", u32(c.n_embd));
  w.set("gpt2.feed_forward_length", u32(c.n_inner > 0 ? c.n_inner : 4 * c.n_embd));
  w.set("gpt2.block_count", u32(c.n_layer));
  w.set("gpt2.attention.head_count", u32(c.n_head));
  w.set("gpt2.attention.layer_norm_epsilon", float(c.layer_norm_epsilon));
  w.set("gpt2.vocab_size", u32(c.vocab_size));
}

std::string gpt2_gguf_name(const std::string& hf) {
  static const NameMap top = {
      {"wte", "token_embd"}, {"wpe", "position_embd"}, {"ln_f", "output_norm"}};
  static const NameMap layer = {{"ln_1", "attn_norm"},          {"attn.c_attn", "attn_qkv"},
                                {"attn.c_proj", "attn_output"}, {"ln_2", "ffn_norm"},
                                {"mlp.c_fc", "ffn_up"},         {"mlp.c_proj", "ffn_down"}};
  return mapped_gguf_name(hf, "h.", top, layer);
}

// HF's Conv1D weights are [in, out]; llama.cpp's [out, in].
Layout gpt2_layout_of(const std::string& hf, const ModelConfig&, int64_t*) {
  for (const char* conv :
       {".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight"})
    if (hf.find(conv) != std::string::npos) return Layout::transposed;
  return Layout::same;
}

}  // namespace

const ArchHooks& arch_gpt2() {
  static const ArchHooks h = [] {
    ArchHooks a{};
    a.read_config = gpt2_read_config;
    a.write_config = gpt2_write_config;
    a.gguf_arch = [](const ModelConfig&) { return std::string("gpt2"); };
    a.read_gguf = gpt2_read_gguf;
    a.write_gguf = gpt2_write_gguf;
    a.gguf_extra_tensors = {"output.weight"};  // llama.cpp's converter writes wte twice
    a.gguf_writes_tied_output = true;
    a.gguf_name = gpt2_gguf_name;
    a.layout_of = gpt2_layout_of;
    a.layers = [](const ModelConfig& c) { return c.gpt2->n_layer; };
    a.layer_field = "n_layer";
    a.layer_prefixes = {"h.", "transformer.h."};
    a.recipe_model = [](const ModelConfig& c) {
      RecipeModel m;
      m.n_layer = c.gpt2->n_layer;
      return m;
    };
    a.embedding = "wte.weight";
    a.tied_head = [](const ModelConfig&) { return true; };
    a.make = make_gpt2;
    return a;
  }();
  return h;
}

}  // namespace kiln::models::detail
