// Hugging Face model directories: load_pretrained / load_weights (config.json,
// generation_config.json, single or sharded safetensors) and save_pretrained.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <unordered_set>

#include "kiln/models.h"
#include "kiln/safetensors.h"
#include "models/architecture.h"
#include "models/convert.h"
#include "models/file_text.h"
#include "models/layer_count.h"
#include "models/mapped_file.h"
#include "models/weight_quant.h"

namespace kiln::models {
namespace {

namespace fs = std::filesystem;

// A tensor of the directory: which file holds it.
struct Located {
  const SafetensorsFile* file = nullptr;
  const TensorInfo* info = nullptr;
};

// The directory's safetensors files and where each tensor lives.
struct Weights {
  std::vector<std::unique_ptr<SafetensorsFile>> files;
  std::map<std::string, Located> tensors;
  std::string source;  // the file errors about a missing tensor name
};

Weights open_weights(const std::string& dir) {
  Weights w;
  const std::string single = (fs::path(dir) / "model.safetensors").string();
  const std::string index = (fs::path(dir) / "model.safetensors.index.json").string();
  if (fs::exists(single)) {
    w.files.push_back(std::make_unique<SafetensorsFile>(single));
    for (const TensorInfo& t : w.files[0]->tensors()) w.tensors[t.name] = {w.files[0].get(), &t};
    w.source = single;
    return w;
  }
  if (!fs::exists(index))
    fail("models", dir, ": neither model.safetensors nor model.safetensors.index.json is there");
  const ShardIndex idx = parse_shard_index(read_text_file(index), index);
  std::map<std::string, const SafetensorsFile*> by_name;
  for (const std::string& shard : idx.shards) {
    const std::string path = (fs::path(dir) / shard).string();
    if (!fs::exists(path))
      fail("models", index, ": field 'weight_map' names shard '", shard, "', which is not in ",
           dir);
    w.files.push_back(std::make_unique<SafetensorsFile>(path));
    by_name[shard] = w.files.back().get();
  }
  for (const auto& [name, shard] : idx.weight_map) {
    const SafetensorsFile* f = by_name.at(shard);
    const TensorInfo* t = f->find(name);
    if (!t)
      fail("models", index, ": field 'weight_map' puts tensor '", name, "' in ", f->path(),
           ", which does not hold it");
    w.tensors[name] = {f, t};
  }
  // A shard tensor the index does not list would be silently dropped.
  for (const auto& f : w.files)
    for (const TensorInfo& t : f->tensors())
      if (!w.tensors.count(t.name) || w.tensors[t.name].file != f.get())
        fail("models", f->path(), ": tensor '", t.name, "' is not listed for this file in ", index);
  w.source = index;
  return w;
}

// The size a safetensors file's header describes: its data section ends with
// the last tensor (the reader checked that the tensors cover it exactly).
uint64_t described_size(const SafetensorsFile& f) {
  uint64_t end = 0;
  for (const TensorInfo& t : f.tensors()) end = std::max(end, f.data_offsets(t.name).second);
  return f.data_offset() + end;
}

// Checks every tensor against the model, then (after allocating the model on
// `backend`, when given) reads them: a file that does not fit the config is
// reported before anything is allocated for it. With a backend, the params take
// the dtypes opt asks for and those the files hold as they are get mapped.
void load_into(CausalLM& model, const std::string& dir, const Weights& w, Backend* backend,
               const ModelOptions& opt, std::chrono::steady_clock::time_point t0) {
  const std::string config = (fs::path(dir) / "config.json").string();
  // Check everything first: the model is written only if every tensor fits.
  struct Item {
    std::string name;
    Tensor param;
    Located loc;
    bool mapped = false;
  };
  std::vector<Item> plan;
  std::unordered_set<std::string_view> used;
  for (const auto& [name, param] : model.named_base_parameters()) {
    auto it = w.tensors.find(name);
    const std::string alt = model.alternate_name(name);
    if (it == w.tensors.end() && !alt.empty()) it = w.tensors.find(alt);
    if (it == w.tensors.end())
      fail("models", w.source, ": tensor '", name, "' is missing (", config,
           " describes a model that has it)");
    const Located& loc = it->second;
    const TensorInfo& ti = *loc.info;
    if (ti.file_dtype != "F32" && ti.file_dtype != "F16" && ti.file_dtype != "BF16")
      fail("models", loc.file->path(), ": tensor '", ti.name, "' is ", ti.file_dtype,
           "; kiln loads F32, F16 and BF16 weights");
    const Shape& want = param.shape();
    bool same = int(ti.dims.size()) == want.ndim();
    for (int d = 0; same && d < want.ndim(); ++d) same = ti.dims[size_t(d)] == want[d];
    if (!same)
      fail("models", loc.file->path(), ": tensor '", ti.name, "' is ", dims_str(ti.dims), " but ",
           config, " implies ", want.str());
    used.insert(it->first);
    plan.push_back({name, param, loc});
  }
  for (const auto& [name, loc] : w.tensors)
    if (!used.count(name) && !model.ignorable_tensor(name))
      fail("models", loc.file->path(), ": tensor '", name, "' is not part of the model ", config,
           " describes (model_type '", model.config().model_type, "')");
  int64_t mapped = 0;
  if (backend) {
    using MaybeDType = std::optional<DType>;
    if (opt.weight_dtype == ModelOptions::WeightDType::stored)
      detail::retype_params(model, plan, [](const Item& it) {
        return it.param.ndim() >= 2 && it.loc.info->dtype != f32 ? MaybeDType(it.loc.info->dtype)
                                                                 : std::nullopt;
      });
    if (opt.weight_dtype == ModelOptions::WeightDType::bf16)
      detail::retype_params(model, plan, [](const Item& it) {
        return it.param.ndim() >= 2 ? MaybeDType(bf16) : std::nullopt;
      });
    if (const std::optional<DType> q = detail::quantized_weight_dtype(opt)) {
      if (!detail::can_map(*backend))
        fail("models", dir, ": weight_dtype ", dtype_name(*q),
             " needs a host backend (CPU, BLAS): ",
             "only the CPU has quantized matmul and embedding kernels");
      const std::set<std::string> names = detail::quantizable_weight_names(model);
      detail::retype_params(model, plan, [&](const Item& it) {  // quantized by set<float> below
        return detail::quantizes(names, it.name, it.param, *q) ? q : std::nullopt;
      });
    }
    if (opt.mmap && detail::can_map(*backend)) {
      detail::MappedFiles maps;
      std::map<const SafetensorsFile*, uint64_t> sizes;
      for (Item& it : plan) {
        const SafetensorsFile& f = *it.loc.file;
        if (it.param.has_data() || it.param.dtype() != it.loc.info->dtype) continue;
        if (!sizes.count(&f)) sizes[&f] = described_size(f);
        const uint64_t at = f.data_offset() + f.data_offsets(it.loc.info->name).first;
        it.mapped = maps.place(it.param, f.path(), sizes[&f], at);
        if (it.mapped) mapped += int64_t(it.loc.info->nbytes);
      }
      maps.hand_over([&](std::unique_ptr<Buffer> b) { model.keep_buffer(std::move(b)); });
    }
    model.allocate(*backend);
  }
  for (Item& it : plan)
    if (!it.param.has_data())
      fail("models", "load_weights: param '", it.param.name(),
           "' has no memory: call allocate(backend)");
  int64_t bytes = 0;
  for (Item& it : plan) {
    const TensorInfo& ti = *it.loc.info;
    bytes += int64_t(ti.nbytes);
    if (it.mapped) continue;
    if (ti.dtype == it.param.dtype()) {
      it.loc.file->read(ti.name, it.param);  // straight into the param's memory
    } else if (it.param.dtype() == f16 || it.param.dtype() == bf16) {  // weight_dtype bf16
      it.param.set(detail::to_half(detail::to_f32(it.loc.file->read_bytes(ti.name), ti.dtype),
                                   it.param.dtype()));
    } else {
      it.param.set(detail::to_f32(it.loc.file->read_bytes(ti.name), ti.dtype));
    }
  }
  detail::freeze_quantized(model);
  model.load_stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  model.load_stats.bytes_read = bytes;
  model.load_stats.bytes_mapped = mapped;
  model.load_stats.peak_rss_bytes = detail::peak_rss_bytes();
}

// Before building: the files hold tensors of every layer the config asks for.
void check_layers(const ModelConfig& cfg, const Weights& w, const std::string& config) {
  detail::LayerNames files;
  for (const auto& [name, loc] : w.tensors) files.names.push_back(name);
  const detail::Architecture& arch = detail::architecture_of(cfg);
  files.prefixes = arch->layer_prefixes;
  detail::check_layers_present(files, arch->layers(cfg), w.source,
                               config + " field '" + arch->layer_field + "'");
}

}  // namespace

void load_weights(CausalLM& model, const std::string& dir) {
  const auto t0 = std::chrono::steady_clock::now();
  load_into(model, dir, open_weights(dir), nullptr, {}, t0);
}

std::unique_ptr<CausalLM> load_pretrained(Context& ctx, Backend& backend, const std::string& dir,
                                          const ModelOptions& opt) {
  if (!fs::is_directory(dir)) fail("models", dir, ": not a directory");
  const auto t0 = std::chrono::steady_clock::now();
  const std::string config = (fs::path(dir) / "config.json").string();
  ModelConfig cfg = read_config(config);
  const std::string gen = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen)) parse_generation_config(read_text_file(gen), gen, cfg.generation);
  const Weights w = open_weights(dir);
  check_layers(cfg, w, config);  // before building a layer the files cannot fill
  std::unique_ptr<CausalLM> model = make_model(ctx, cfg, opt);
  load_into(*model, dir, w, &backend, opt, t0);
  return model;
}

void save_pretrained(const CausalLM& model, const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) fail("models", dir, ": cannot create the directory (", ec.message(), ")");
  std::vector<NamedTensor> tensors;
  for (const auto& [name, t] : model.named_base_parameters()) tensors.push_back({name, t});
  save_safetensors((fs::path(dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  auto write_text = [&](const std::string& file, const std::string& text) {
    // Written next to the target and renamed over it, so a crash leaves the old file.
    const fs::path target = fs::path(dir) / file;
    const fs::path tmp = fs::path(dir) / (file + ".tmp");
    {
      std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
      out << text;
      out.flush();
      if (!out) fail("models", tmp.string(), ": write failed");
    }
    fs::rename(tmp, target, ec);
    if (ec) fail("models", target.string(), ": cannot write (", ec.message(), ")");
  };
  const ModelConfig& cfg = model.config();
  write_text("config.json", config_json(cfg));
  std::ostringstream gen;
  gen << "{\n";
  if (cfg.generation.bos_token_id >= 0)
    gen << "  \"bos_token_id\": " << cfg.generation.bos_token_id << ",\n";
  gen << "  \"eos_token_id\": [";
  for (size_t i = 0; i < cfg.generation.eos_token_ids.size(); ++i)
    gen << (i ? ", " : "") << cfg.generation.eos_token_ids[i];
  gen << "]\n}\n";
  write_text("generation_config.json", gen.str());
}

}  // namespace kiln::models
