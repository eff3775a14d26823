// Models as GGUF files in llama.cpp's conventions: its tensor names and metadata
// keys, the Q/K row order its converter gives the "llama" architecture, GPT-2's
// linear weights [out, in], and Llama 3's RoPE scaling as a rope_freqs tensor.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include "kiln/io.h"
#include "kiln/models.h"
#if defined(KILN_HAVE_TOKENIZER)
#include "kiln/tokenizer.h"
#endif
#include "models/convert.h"
#include "models/gguf_layout.h"
#include "models/layer_count.h"
#include "models/mapped_file.h"
#include "models/rope.h"
#include "models/weight_quant.h"

namespace kiln::models {
namespace {

using detail::arch_of;
using detail::gguf_name;
using detail::Layout;
using detail::layout_of;
using detail::reorder_rope_rows;
using detail::transpose;

// Puts a tensor's values (the file's layout) into its param in kiln's layout.
template <class T>
void set_param(Tensor param, std::vector<T> v, Layout layout, int64_t heads, const Shape& s) {
  if (layout == Layout::rope_pairs) v = reorder_rope_rows(v, heads, s[0], false);
  if (layout == Layout::transposed) v = transpose(v, s[0], s[1]);
  param.set(v);
}

// Metadata of one file, each key marked when read so that unknown ones of the
// architecture's namespace can be reported.
class Meta {
 public:
  Meta(const GgufFile& f, std::string arch) : f_(f), arch_(std::move(arch)) {}
  const GgufValue* find(const std::string& key) {
    read_.insert(arch_ + "." + key);
    return f_.find(arch_ + "." + key);
  }
  int64_t integer(const std::string& key) {
    const GgufValue* v = find(key);
    if (!v) fail("models", f_.path(), ": metadata '", arch_, ".", key, "' is missing");
    const int64_t x = v->as_int();
    if (x <= 0) fail("models", f_.path(), ": metadata '", arch_, ".", key, "' must be > 0");
    return x;
  }
  int64_t integer(const std::string& key, int64_t fallback) {
    return find(key) ? integer(key) : fallback;
  }
  double number(const std::string& key, double fallback) {
    const GgufValue* v = find(key);
    return v ? v->as_float() : fallback;
  }
  void reject_unread() const {
    for (const auto& [key, v] : f_.metadata()) {
      if (key.rfind("general.", 0) == 0 || key.rfind("tokenizer.", 0) == 0) continue;
      if (read_.count(key)) continue;
      fail("models", f_.path(), ": metadata '", key, "' is not supported by kiln's ", arch_,
           " model (kiln does not ignore settings it does not implement)");
    }
  }

 private:
  const GgufFile& f_;
  std::string arch_;
  std::set<std::string> read_;
};

// llama.cpp's rope.scaling.* keys: type "linear" (factor) or "yarn" (factor,
// original_context_length, yarn_beta_fast/slow); "none" or no type: none (Llama
// 3's scaling comes as the rope_freqs tensor). Keys kiln does not apply
// (attn_factor, yarn_ext_factor, yarn_attn_factor, yarn_log_multiplier) stay
// unread, so the file is refused naming them.
std::optional<RopeScaling> rope_scaling_from(Meta& m, const std::string& file,
                                             const std::string& arch, int64_t context) {
  m.find("rope.scaling.finetuned");  // bookkeeping: changes nothing computed
  std::string type = "none";
  if (const GgufValue* t = m.find("rope.scaling.type")) type = t->as_string();
  const GgufValue* old_linear = m.find("rope.scale_linear");  // older files' linear factor
  if (type == "none" && old_linear && old_linear->as_float() != 1.0) type = "linear";
  if (type == "none") return std::nullopt;
  if (type != "linear" && type != "yarn")
    fail("models", file, ": metadata '", arch, ".rope.scaling.type' is '", type,
         "', which kiln does not support in GGUF files (supported: none, linear, yarn; Llama 3's ",
         "scaling comes as the rope_freqs tensor)");
  RopeScaling r;
  const GgufValue* factor = m.find("rope.scaling.factor");
  if (!factor) factor = old_linear;
  r.factor = factor ? factor->as_float() : 0.0;
  if (!(r.factor > 0))
    fail("models", file, ": metadata '", arch, ".rope.scaling.factor' must be given and > 0 for ",
         "rope.scaling.type '", type, "'");
  r.type = type == "linear" ? RopeScaling::Type::linear : RopeScaling::Type::yarn;
  if (r.type == RopeScaling::Type::yarn) {
    r.original_max_position_embeddings = m.integer("rope.scaling.original_context_length", context);
    r.beta_fast = m.number("rope.scaling.yarn_beta_fast", 32.0);
    r.beta_slow = m.number("rope.scaling.yarn_beta_slow", 1.0);
    if (!(r.beta_fast > 0) || !(r.beta_slow > 0))
      fail("models", file, ": metadata '", arch,
           ".rope.scaling.yarn_beta_fast' and yarn_beta_slow must be > 0");
  }
  return r;
}

ModelConfig config_from(const GgufFile& f) {
  const GgufValue* a = f.find("general.architecture");
  if (!a) fail("models", f.path(), ": metadata 'general.architecture' is missing");
  const std::string arch = a->as_string();
  if (arch != "llama" && arch != "qwen2" && arch != "qwen3" && arch != "gpt2")
    fail("models", f.path(), ": metadata 'general.architecture' is '", arch,
         "', an architecture kiln does not know (supported: llama, qwen2, qwen3, gpt2)");
  Meta m(f, arch);
  ModelConfig cfg;
  const GgufTensorInfo* embd = f.find_tensor("token_embd.weight");
  if (!embd || embd->shape.ndim() != 2)
    fail("models", f.path(), ": tensor 'token_embd.weight' is missing or not 2-D");
  const int64_t vocab = m.integer("vocab_size", embd->shape[0]);
  if (arch == "gpt2") {
    Gpt2Config g;
    g.vocab_size = vocab;
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
  } else {
    LlamaConfig c;
    c.vocab_size = vocab;
    c.max_position_embeddings = m.integer("context_length");
    c.hidden_size = m.integer("embedding_length");
    c.num_hidden_layers = m.integer("block_count");
    c.intermediate_size = m.integer("feed_forward_length");
    c.num_attention_heads = m.integer("attention.head_count");
    c.num_key_value_heads = m.integer("attention.head_count_kv", c.num_attention_heads);
    c.head_dim = m.integer("attention.key_length", c.hidden_size / c.num_attention_heads);
    if (m.integer("rope.dimension_count", c.head_dim) != c.head_dim)
      fail("models", f.path(), ": metadata '", arch,
           ".rope.dimension_count' differs from the head dim: partial RoPE is not supported");
    if (m.integer("attention.value_length", c.head_dim) != c.head_dim)
      fail("models", f.path(), ": metadata '", arch,
           ".attention.value_length' differs from key_length: not supported");
    c.rms_norm_eps = m.number("attention.layer_norm_rms_epsilon", 1e-5);
    c.rope_theta = m.number("rope.freq_base", 10000.0);
    c.rope_scaling = rope_scaling_from(m, f.path(), arch, c.max_position_embeddings);
    c.sliding_window = m.integer("attention.sliding_window", 0);
    c.model_type = arch == "llama" && c.sliding_window > 0 ? "mistral" : arch;
    c.tie_word_embeddings = f.find_tensor("output.weight") == nullptr;
    c.qkv_bias = arch == "qwen2" || f.find_tensor("blk.0.attn_q.bias") != nullptr;
    c.o_bias = f.find_tensor("blk.0.attn_output.bias") != nullptr;
    c.mlp_bias = f.find_tensor("blk.0.ffn_gate.bias") != nullptr;
    c.qk_norm = arch == "qwen3";
    if (const GgufTensorInfo* rf = f.find_tensor("rope_freqs.weight")) {
      if (rf->dtype != f32 || rf->quantized() || rf->shape.numel() != c.head_dim / 2)
        fail("models", f.path(), ": tensor 'rope_freqs.weight' must be f32 [", c.head_dim / 2,
             "], got ", dtype_name(rf->dtype), " ", rf->shape.str());
      c.rope_freq_factors = detail::to_f32(f.read_bytes("rope_freqs.weight"), f32);
    }
    if (c.num_attention_heads % c.num_key_value_heads != 0 || c.head_dim % 2 != 0)
      fail("models", f.path(), ": metadata '", arch,
           ".attention.head_count_kv' must divide head_count, and the head dim be even");
    cfg.model_type = c.model_type;
    cfg.llama = c;
  }
  m.reject_unread();
  if (const GgufValue* v = f.find("tokenizer.ggml.eos_token_id"))
    cfg.generation.eos_token_ids = {v->as_int()};
  if (const GgufValue* v = f.find("tokenizer.ggml.bos_token_id"))
    cfg.generation.bos_token_id = v->as_int();
  return cfg;
}

}  // namespace

ModelConfig read_gguf_config(const std::string& path) { return config_from(GgufFile(path)); }

std::unique_ptr<CausalLM> load_gguf(Context& ctx, Backend& backend, const std::string& path,
                                    const ModelOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  GgufFile f(path);
  const ModelConfig cfg = config_from(f);
  {  // before building a layer the file cannot fill
    detail::LayerNames names;
    names.prefixes = {"blk."};
    for (const GgufTensorInfo& t : f.tensors()) names.names.push_back(t.name);
    const int64_t layers = cfg.gpt2 ? cfg.gpt2->n_layer : cfg.llama->num_hidden_layers;
    detail::check_layers_present(names, layers, path,
                                 "metadata '" + arch_of(cfg) + ".block_count'");
  }
  std::unique_ptr<CausalLM> model = make_model(ctx, cfg, opt);
  const bool gpt2 = bool(cfg.gpt2);
  // Check every tensor before writing any.
  struct Item {
    std::string name;
    Tensor param;
    const GgufTensorInfo* info;
    Layout layout;
    int64_t heads;
    bool mapped = false;
  };
  std::vector<Item> plan;
  std::set<std::string> used = {"rope_freqs.weight"};
  if (gpt2) used.insert("output.weight");  // llama.cpp's converter writes wte twice
  for (const auto& [name, param] : model->named_base_parameters()) {
    const std::string gname = gguf_name(name, gpt2);
    const GgufTensorInfo* ti = f.find_tensor(gname);
    if (!ti)
      fail("models", path, ": tensor '", gname, "' (", name,
           ") is missing: the file's metadata describes a model that has it");
    if (ti->dtype == i32 && !ti->quantized())
      fail("models", path, ": tensor '", gname,
           "' is i32; kiln loads f32, f16, bf16, Q8_0 and Q4_0 weights");
    int64_t heads = 0;
    const Layout lay = layout_of(name, cfg, &heads);
    Shape want = param.shape();
    if (lay == Layout::transposed) want = Shape({want[1], want[0]});
    if (ti->shape != want)
      fail("models", path, ": tensor '", gname, "' is ", ti->shape.str(),
           " but the metadata implies ", want.str());
    used.insert(gname);
    plan.push_back({name, param, ti, lay, heads});
  }
  for (const GgufTensorInfo& t : f.tensors())
    if (!used.count(t.name))
      fail("models", path, ": tensor '", t.name, "' is not part of the ", arch_of(cfg),
           " model the metadata describes");
  // Kept f16/bf16 matrices: moving rows (q/k order, transposes) needs no conversion.
  using MaybeDType = std::optional<DType>;
  if (opt.weight_dtype == ModelOptions::WeightDType::stored)
    detail::retype_params(*model, plan, [](const Item& it) {
      return it.param.ndim() >= 2 && !it.info->quantized() && it.info->dtype != f32
                 ? MaybeDType(it.info->dtype)
                 : std::nullopt;
    });
  if (opt.weight_dtype == ModelOptions::WeightDType::bf16)
    detail::retype_params(*model, plan, [](const Item& it) {
      return it.param.ndim() >= 2 ? MaybeDType(bf16) : std::nullopt;
    });
  // Quantized Linear weights: tensors of a type matmul reads (every row of
  // kiln/quant_types.def whose matmul column is qmatmul: today all) kept as
  // stored (rows moved as bytes); others dequantized to f32 as they load, or
  // quantized again to weight_dtype's type; other dtypes quantized as they
  // load (ModelOptions::WeightDType).
  const std::optional<DType> q = detail::quantized_weight_dtype(opt);
  // Only the CPU reads quantized blocks: other backends get f32 (stored) or an error.
  if (q && !detail::can_map(backend))
    fail("models", path, ": weight_dtype ", dtype_name(*q), " needs a host backend (CPU, BLAS): ",
         "only the CPU has quantized matmul and embedding kernels");
  if (q || (opt.weight_dtype == ModelOptions::WeightDType::stored && detail::can_map(backend))) {
    const std::set<std::string> names = detail::quantizable_weight_names(*model);
    detail::retype_params(*model, plan, [&](const Item& it) {
      const bool keep = it.info->quantized() && quant_type(it.info->dtype).matmul_reads &&
                        it.layout != Layout::transposed;
      if (keep && detail::quantizes(names, it.name, it.param, it.info->dtype))
        return MaybeDType(it.info->dtype);
      if (q && detail::quantizes(names, it.name, it.param, *q)) return q;
      return MaybeDType();
    });
  }
  int64_t mapped = 0;
  if (opt.mmap && detail::can_map(backend)) {
    detail::MappedFiles maps;
    for (Item& it : plan) {
      if (it.param.has_data() || it.layout != Layout::same || it.param.dtype() != it.info->dtype)
        continue;
      it.mapped = maps.place(it.param, path, f.file_size(), it.info->offset);
      if (it.mapped) mapped += int64_t(it.info->nbytes);
    }
    maps.hand_over([&](std::unique_ptr<Buffer> b) { model->keep_buffer(std::move(b)); });
  }
  model->allocate(backend);  // only once the file fits the model
  int64_t bytes = 0;
  for (Item& it : plan) {
    bytes += int64_t(it.info->nbytes);
    if (it.mapped) continue;
    if (it.layout == Layout::same && it.param.dtype() == it.info->dtype) {
      f.load(it.param, it.info->name);  // as stored: straight into the param's memory
      continue;
    }
    const std::vector<uint8_t> raw = f.read_bytes(it.info->name);
    if (it.param.dtype() == it.info->dtype && it.info->quantized()) {
      set_param(it.param, raw, it.layout, it.heads, it.info->shape);  // whole rows of blocks
    } else if (it.param.dtype() == f32 || is_quantized(it.param.dtype())) {
      // f32, f16, bf16, any quantized type -> f32 (quantized again by set<float> for a q param)
      set_param(it.param, gguf_dequantize(*it.info, raw), it.layout, it.heads, it.info->shape);
    } else if (it.param.dtype() != it.info->dtype) {  // weight_dtype bf16: rounded
      set_param(it.param, detail::to_half(gguf_dequantize(*it.info, raw), it.param.dtype()),
                it.layout, it.heads, it.info->shape);
    } else {  // kept as stored: the same 16-bit values
      std::vector<uint16_t> v(raw.size() / 2);
      std::memcpy(v.data(), raw.data(), v.size() * 2);
      set_param(it.param, std::move(v), it.layout, it.heads, it.info->shape);
    }
  }
  detail::freeze_quantized(*model);
  model->load_stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  model->load_stats.bytes_read = bytes;
  model->load_stats.bytes_mapped = mapped;
  model->load_stats.peak_rss_bytes = detail::peak_rss_bytes();
  return model;
}

namespace {

// A param as save_gguf writes it: its GGUF name, its shape in the file and how
// its values are laid out there.
struct SavedTensor {
  std::string gguf;
  Tensor param;
  Shape shape;
  Layout layout;
  int64_t heads = 0;
};

// The tensors save_gguf writes (rope_freqs aside). GPT-2's tied table goes in
// twice (token_embd and output, as llama.cpp's converter writes it) unless
// `recipe`: its file then has token_embd alone, which llama.cpp reads as the head.
std::vector<SavedTensor> saved_tensors(const CausalLM& model, bool recipe) {
  const ModelConfig& cfg = model.config();
  std::vector<SavedTensor> out;
  for (const auto& [name, t] : model.named_base_parameters()) {
    SavedTensor s{gguf_name(name, bool(cfg.gpt2)), t, t.shape(), Layout::same};
    s.layout = layout_of(name, cfg, &s.heads);
    if (s.layout == Layout::transposed) s.shape = Shape({t.size(1), t.size(0)});
    out.push_back(s);
    if (cfg.gpt2 && !recipe && s.gguf == "token_embd.weight") {
      s.gguf = "output.weight";
      out.push_back(s);
    }
  }
  return out;
}

// What llama.cpp's recipes read of a model (RecipeModel): its layer count, query
// heads per key-value head, and whether llama.cpp sizes it as 70B (the Llama
// architecture with 80 layers and grouped-query attention, Qwen2 with 80).
RecipeModel recipe_model(const ModelConfig& cfg) {
  RecipeModel m;
  if (cfg.gpt2) {
    m.n_layer = cfg.gpt2->n_layer;
    return m;
  }
  const LlamaConfig& c = *cfg.llama;
  m.n_layer = c.num_hidden_layers;
  m.n_gqa = c.num_attention_heads / c.num_key_value_heads;
  const std::string arch = arch_of(cfg);
  m.is_70b =
      c.num_hidden_layers == 80 &&
      ((arch == "llama" && c.num_attention_heads != c.num_key_value_heads) || arch == "qwen2");
  return m;
}

std::vector<DType> recipe_types(std::string_view recipe, const CausalLM& model,
                                const std::vector<SavedTensor>& saved) {
  std::vector<RecipeTensor> descs;
  for (const SavedTensor& s : saved) descs.push_back({s.gguf, s.shape});
  return quant_recipe_types(recipe, recipe_model(model.config()), descs);
}

// A tensor's bytes as `type` (f32, f16 or a block type) from its values.
std::vector<uint8_t> encode(const std::vector<float>& v, DType type) {
  std::vector<uint8_t> out;
  if (type == f32 || type == f16) {
    out.resize(v.size() * dtype_size(type));
    if (type == f32) std::memcpy(out.data(), v.data(), out.size());
    else {
      const std::vector<uint16_t> h = detail::to_half(v, f16);
      std::memcpy(out.data(), h.data(), out.size());
    }
    return out;
  }
  out.resize(dtype_row_bytes(type, int64_t(v.size())));
  quantize_row(type, v.data(), out.data(), int64_t(v.size()));  // rows are whole blocks
  return out;
}

}  // namespace

std::vector<std::pair<std::string, DType>> quant_recipe_types(std::string_view recipe,
                                                              const CausalLM& model) {
  const std::vector<SavedTensor> saved = saved_tensors(model, true);
  const std::vector<DType> types = recipe_types(recipe, model, saved);
  std::vector<std::pair<std::string, DType>> out;
  for (size_t i = 0; i < saved.size(); ++i) out.emplace_back(saved[i].gguf, types[i]);
  return out;
}

void save_gguf(const CausalLM& model, const std::string& path, const Tokenizer* tokenizer,
               std::string_view recipe) {
  const ModelConfig& cfg = model.config();
  const std::string arch = arch_of(cfg);
  const bool gpt2 = bool(cfg.gpt2);
  GgufWriter w;
  auto u32 = [](int64_t x) { return GgufValue(uint32_t(x)); };
  if (tokenizer) {
#if defined(KILN_HAVE_TOKENIZER)
    // llama.cpp takes the vocabulary's size from the token list and indexes the
    // embedding rows with it, so the two must agree.
    if (tokenizer->vocab_size() != model.vocab_size())
      fail("models", path, ": the tokenizer has ", tokenizer->vocab_size(),
           " tokens but the model's vocab_size is ", model.vocab_size());
    tokenizer->write_gguf_vocab(w);
#else
    fail("models", path, ": kiln was built without its tokenizer (KILN_TOKENIZER)");
#endif
  }
  w.set("general.architecture", arch);
  w.set("general.name", "kiln model");
  // llama.cpp's file type (what it prints): all f32 (0), or mostly Q4_0 (2) /
  // Q8_0 (7), after the quantized dtype most written matrices have (GPT-2's
  // transposed Conv1D weights are written f32).
  int64_t n4 = 0, n8 = 0;
  for (const auto& [name, t] : model.named_base_parameters()) {
    int64_t heads = 0;
    if (layout_of(name, cfg, &heads) == Layout::transposed) continue;
    n4 += t.dtype() == q4_0;
    n8 += t.dtype() == q8_0;
  }
  w.set("general.file_type", recipe.empty() ? uint32_t(n4 + n8 == 0 ? 0
                                                       : n4 >= n8   ? 2
                                                                    : 7)
                                            : quant_recipe_file_type(recipe));
  const std::string k = arch + ".";
  if (gpt2) {
    const Gpt2Config& c = *cfg.gpt2;
    w.set(k + "context_length", u32(c.n_positions));
    w.set(k + "embedding_length", u32(c.n_embd));
    w.set(k + "feed_forward_length", u32(c.n_inner > 0 ? c.n_inner : 4 * c.n_embd));
    w.set(k + "block_count", u32(c.n_layer));
    w.set(k + "attention.head_count", u32(c.n_head));
    w.set(k + "attention.layer_norm_epsilon", float(c.layer_norm_epsilon));
    w.set(k + "vocab_size", u32(c.vocab_size));
  } else {
    const LlamaConfig& c = *cfg.llama;
    w.set(k + "context_length", u32(c.max_position_embeddings));
    w.set(k + "embedding_length", u32(c.hidden_size));
    w.set(k + "feed_forward_length", u32(c.intermediate_size));
    w.set(k + "block_count", u32(c.num_hidden_layers));
    w.set(k + "attention.head_count", u32(c.num_attention_heads));
    w.set(k + "attention.head_count_kv", u32(c.num_key_value_heads));
    w.set(k + "attention.key_length", u32(c.head_dim));
    w.set(k + "attention.value_length", u32(c.head_dim));
    w.set(k + "rope.dimension_count", u32(c.head_dim));
    w.set(k + "rope.freq_base", float(c.rope_theta));
    w.set(k + "attention.layer_norm_rms_epsilon", float(c.rms_norm_eps));
    w.set(k + "vocab_size", u32(c.vocab_size));
    if (c.sliding_window > 0) w.set(k + "attention.sliding_window", u32(c.sliding_window));
    using T = RopeScaling::Type;
    const std::optional<RopeScaling>& rs = c.rope_scaling;
    if (rs && rs->type == T::linear) {
      w.set(k + "rope.scaling.type", "linear");
      w.set(k + "rope.scaling.factor", float(rs->factor));
    } else if (rs && rs->type == T::yarn) {
      // llama.cpp's YaRN is transformers' with the default attention factor
      // (0.1 ln(factor) + 1) and the ramp's ends rounded outwards.
      if (rs->attention_factor || rs->mscale != 0 || rs->mscale_all_dim != 0 || !rs->truncate)
        fail("models", path, ": yarn rope scaling with attention_factor, mscale or truncate ",
             "false has no GGUF form kiln writes (llama.cpp's keys cannot say it)");
      w.set(k + "rope.scaling.type", "yarn");
      w.set(k + "rope.scaling.factor", float(rs->factor));
      w.set(k + "rope.scaling.original_context_length", u32(rs->original_max_position_embeddings));
      w.set(k + "rope.scaling.yarn_beta_fast", float(rs->beta_fast));
      w.set(k + "rope.scaling.yarn_beta_slow", float(rs->beta_slow));
    } else if (rs && rs->type != T::llama3) {
      fail("models", path, ": rope scaling '", rope_scaling_name(rs->type),
           "' has no GGUF form (llama.cpp's rope.scaling.type is none, linear, yarn or longrope ",
           "with Phi-3's tensors; kiln writes linear, yarn and llama3)");
    } else if (rs || !c.rope_freq_factors.empty()) {
      // Llama 3's scaling as llama.cpp stores it: a divisor per frequency.
      LlamaConfig plain = c;
      plain.rope_scaling.reset();
      plain.rope_freq_factors.clear();
      const std::vector<double> base = detail::rope_inv_freq(plain),
                                scaled = detail::rope_inv_freq(c);
      std::vector<float> factors(base.size());
      for (size_t i = 0; i < base.size(); ++i) factors[i] = float(base[i] / scaled[i]);
      w.add_tensor_data("rope_freqs.weight", f32, {int64_t(factors.size())},
                        {reinterpret_cast<const uint8_t*>(factors.data()), factors.size() * 4});
    }
  }
  if (!cfg.generation.eos_token_ids.empty())
    w.set("tokenizer.ggml.eos_token_id", u32(cfg.generation.eos_token_ids[0]));
  if (cfg.generation.bos_token_id >= 0)
    w.set("tokenizer.ggml.bos_token_id", u32(cfg.generation.bos_token_id));
  auto add = [&](const std::string& gname, const Shape& shape, const std::vector<float>& v) {
    w.add_tensor_data(gname, f32, shape,
                      {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
  };
  for (const auto& [name, t] : model.named_base_parameters())
    if (!t.has_data()) fail("models", "save_gguf: param '", name, "' has no memory");
  if (!recipe.empty()) {
    const std::vector<SavedTensor> saved = saved_tensors(model, true);
    const std::vector<DType> types = recipe_types(recipe, model, saved);
    for (size_t i = 0; i < saved.size(); ++i) {
      const SavedTensor& s = saved[i];
      const DType type = types[i];
      if (type == s.param.dtype() && is_quantized(type) && s.layout != Layout::transposed) {
        // Already the type picked: its blocks as they are (llama-quantize copies them too).
        std::vector<uint8_t> b = s.param.get<uint8_t>();
        if (s.layout == Layout::rope_pairs) b = reorder_rope_rows(b, s.heads, s.shape[0], true);
        w.add_tensor_data(s.gguf, type, s.shape, b);
        continue;
      }
      std::vector<float> v = detail::values_f32(s.param);
      if (s.layout == Layout::rope_pairs) v = reorder_rope_rows(v, s.heads, s.shape[0], true);
      if (s.layout == Layout::transposed) v = transpose(v, s.shape[1], s.shape[0]);
      w.add_tensor_data(s.gguf, type, s.shape, encode(v, type));
    }
    w.save(path);
    return;
  }
  for (const auto& [name, t] : model.named_base_parameters()) {
    int64_t qheads = 0;
    const Layout qlay = layout_of(name, cfg, &qheads);
    if (is_quantized(t.dtype()) && qlay != Layout::transposed) {
      // Q8_0 / Q4_0 as they are (rows moved as bytes): llama.cpp reads kiln's blocks.
      std::vector<uint8_t> b = t.get<uint8_t>();
      if (qlay == Layout::rope_pairs) b = reorder_rope_rows(b, qheads, t.size(0), true);
      const std::string gname = gguf_name(name, gpt2);
      w.add_tensor_data(gname, t.dtype(), t.shape(), b);
      if (gpt2 && gname == "token_embd.weight")
        w.add_tensor_data("output.weight", t.dtype(), t.shape(), b);
      continue;
    }
    std::vector<float> v = detail::values_f32(t);  // f32 files, kept f16/bf16 included
    Shape s = t.shape();
    int64_t heads = 0;
    const Layout lay = layout_of(name, cfg, &heads);
    if (lay == Layout::rope_pairs) v = reorder_rope_rows(v, heads, s[0], true);
    if (lay == Layout::transposed) {
      v = transpose(v, s[0], s[1]);
      s = Shape({s[1], s[0]});
    }
    const std::string gname = gguf_name(name, gpt2);
    add(gname, s, v);
    if (gpt2 && gname == "token_embd.weight") add("output.weight", s, v);
  }
  w.save(path);
}

}  // namespace kiln::models
