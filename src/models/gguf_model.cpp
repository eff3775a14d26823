// Models as GGUF files in llama.cpp's conventions: each architecture's tensor
// names, metadata keys and row layouts come from its row (models/architecture.h:
// the Q/K row order of the "llama" architecture, GPT-2's linear weights [out,
// in], Llama 3's RoPE scaling as a rope_freqs tensor); the reading, checking,
// quantizing and writing of tensors is here, the same for all.
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
#include "models/architecture.h"
#include "models/convert.h"
#include "models/gguf_layout.h"
#include "models/layer_count.h"
#include "models/mapped_file.h"
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

ModelConfig config_from(const GgufFile& f) {
  const GgufValue* a = f.find("general.architecture");
  if (!a) fail("models", f.path(), ": metadata 'general.architecture' is missing");
  const std::string arch = a->as_string();
  const detail::Architecture* row = detail::architecture_for_gguf(arch);
  if (!row)
    fail("models", f.path(), ": metadata 'general.architecture' is '", arch,
         "', an architecture kiln does not know (supported: ", detail::supported_gguf_archs(), ")");
  detail::GgufMeta m(f, arch);
  ModelConfig cfg;
  (*row)->read_gguf(m, cfg);
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
    const int64_t layers = detail::architecture_of(cfg)->layers(cfg);
    detail::check_layers_present(names, layers, path,
                                 "metadata '" + arch_of(cfg) + ".block_count'");
  }
  std::unique_ptr<CausalLM> model = make_model(ctx, cfg, opt);
  const detail::Architecture& arch = detail::architecture_of(cfg);
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
  std::set<std::string> used(arch->gguf_extra_tensors.begin(), arch->gguf_extra_tensors.end());
  for (const auto& [name, param] : model->named_base_parameters()) {
    const std::string gname = gguf_name(name, cfg);
    if (gname.empty())
      fail("models", path, ": param '", name, "' has no GGUF tensor name in kiln's ", arch_of(cfg),
           " architecture");
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

// GPT-2's tied table goes in twice, as token_embd and output (architecture.h).
bool tied_output(const ModelConfig& cfg) {
  return detail::architecture_of(cfg)->gguf_writes_tied_output;
}

// The tensors save_gguf writes (rope_freqs aside). GPT-2's tied table goes in
// twice (token_embd and output, as llama.cpp's converter writes it) unless
// `recipe`: its file then has token_embd alone, which llama.cpp reads as the head.
std::vector<SavedTensor> saved_tensors(const CausalLM& model, bool recipe) {
  const ModelConfig& cfg = model.config();
  std::vector<SavedTensor> out;
  for (const auto& [name, t] : model.named_base_parameters()) {
    SavedTensor s{gguf_name(name, cfg), t, t.shape(), Layout::same};
    s.layout = layout_of(name, cfg, &s.heads);
    if (s.layout == Layout::transposed) s.shape = Shape({t.size(1), t.size(0)});
    out.push_back(s);
    if (tied_output(cfg) && !recipe && s.gguf == "token_embd.weight") {
      s.gguf = "output.weight";
      out.push_back(s);
    }
  }
  return out;
}

std::vector<DType> recipe_types(std::string_view recipe, const CausalLM& model,
                                const std::vector<SavedTensor>& saved) {
  std::vector<RecipeTensor> descs;
  for (const SavedTensor& s : saved) descs.push_back({s.gguf, s.shape});
  return quant_recipe_types(
      recipe, detail::architecture_of(model.config())->recipe_model(model.config()), descs);
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
  const bool tied_out = tied_output(cfg);
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
  detail::architecture_of(cfg)->write_gguf(cfg, w, path);
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
      const std::string gname = gguf_name(name, cfg);
      w.add_tensor_data(gname, t.dtype(), t.shape(), b);
      if (tied_out && gname == "token_embd.weight")
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
    const std::string gname = gguf_name(name, cfg);
    add(gname, s, v);
    if (tied_out && gname == "token_embd.weight") add("output.weight", s, v);
  }
  w.save(path);
}

}  // namespace kiln::models
