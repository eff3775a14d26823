// kiln::models (docs/models.md): pretrained architectures on kiln::nn modules,
// loaded from Hugging Face model directories and GGUF files.
//
//   kiln::Context ctx;
//   kiln::CpuBackend cpu;
//   auto model = kiln::models::load(ctx, cpu, "path/to/Llama-3.2-1B");  // or a .gguf file
//   kiln::Tensor ids = ctx.input(kiln::i32, {1, 12}, "input_ids");
//   kiln::Tensor logits = (*model)(ids);            // f32 [1, 12, vocab]
//   kiln::Graph g = kiln::Graph::forward(logits);   // then allocate and compute as usual
//
// Architectures (one row each in src/models/architectures.def): the Llama family
// as one configurable model (model_type llama, mistral, qwen2, qwen3, phi3:
// RMSNorm, RoPE with linear, dynamic, yarn, longrope or llama3 frequency
// scaling, partial rotary, SwiGLU, grouped- and multi-query attention, tied or
// untied head, attention biases, per-head q/k RMSNorm, a sliding window, Phi-3's
// fused projections) and GPT-2. Parameter names are Hugging
// Face's ("model.layers.0.self_attn.q_proj.weight", "h.0.attn.c_attn.weight"), so
// a state dict maps 1:1 to the files. The models are ordinary nn::Modules: the
// same graph trains (gradients reach every parameter).
//
// Every field of config.json is either used, known to be harmless (listed in
// src/models/config.cpp), or an error naming it: kiln never runs a model whose
// config asks for something it silently does not do.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/nn.h"

namespace kiln {
class Tokenizer;  // kiln/tokenizer.h (the optional tokenizer layer)
}

namespace kiln::models {

// Rescaled RoPE frequencies for contexts longer than pretraining's: config.json's
// "rope_scaling" (or transformers' newer "rope_parameters"), GGUF's rope.scaling.*
// keys. The formulas are transformers' (docs/models.md, "RoPE scaling"); kiln
// computes the cos/sin tables once, for ModelOptions::max_seq_len positions.
struct RopeScaling {
  enum class Type {
    llama3,    // Llama 3.1: long wavelengths slowed by factor, short kept, a blend between
    linear,    // every frequency divided by factor (position interpolation)
    dynamic,   // NTK-aware: theta raised for the table's length, when it exceeds
               // max_position_embeddings (transformers' "dynamic" at that length)
    yarn,      // YaRN: a ramp between interpolated and original frequencies by
               // wavelength (beta_fast, beta_slow), cos/sin scaled by attention_factor
    longrope,  // LongRoPE (Phi-3): per-frequency divisors, short_factor or long_factor
  };
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  // The pretraining context (llama3, yarn, longrope).
  int64_t original_max_position_embeddings = 8192;
  Type type = Type::llama3;
  double beta_fast = 32.0, beta_slow = 1.0;  // yarn
  bool truncate = true;  // yarn: the ramp's ends rounded to whole dims (floor, ceil)
  // yarn, longrope: the factor cos and sin are multiplied by. Unset: yarn's
  // 0.1 ln(factor) + 1 (or the ratio mscale / mscale_all_dim give), longrope's
  // sqrt(1 + ln(factor) / ln(original_max_position_embeddings)).
  std::optional<double> attention_factor;
  double mscale = 0.0, mscale_all_dim = 0.0;      // yarn (DeepSeek's form of attention_factor)
  std::vector<double> short_factor, long_factor;  // longrope: head_dim / 2 each
};
// The name of a RoPE scaling type as configs spell it ("yarn").
const char* rope_scaling_name(RopeScaling::Type t);

// The Llama family (model_type llama, mistral, qwen2, qwen3, phi3), HF's field names.
struct LlamaConfig {
  std::string model_type = "llama";
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;  // < heads: grouped-query; 1: multi-query
  int64_t head_dim = 0;             // hidden_size / heads unless the config sets it
  int64_t max_position_embeddings = 2048;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  std::optional<RopeScaling> rope_scaling;
  // Per-frequency divisors of the inverse frequencies, as GGUF files store Llama
  // 3's scaling (the rope_freqs tensor); empty: none. Exclusive with rope_scaling.
  std::vector<float> rope_freq_factors;
  bool qkv_bias = false;  // q_proj, k_proj, v_proj have biases (Qwen2, attention_bias)
  bool o_bias = false;    // o_proj has a bias (attention_bias)
  bool mlp_bias = false;
  bool qk_norm = false;  // RMSNorm over each head of q and k before RoPE (Qwen3)
  bool tie_word_embeddings = false;
  int64_t sliding_window = 0;  // > 0: a query sees its last sliding_window keys (itself included)
  float attention_dropout = 0.0f;
  // Phi-3: q, k and v as one projection (self_attn.qkv_proj, rows q | k | v)
  // and gate and up as one (mlp.gate_up_proj, rows gate | up), as its files
  // store them.
  bool fused_projections = false;
  // Dims of each head RoPE rotates, the first ones (partial_rotary_factor *
  // head_dim; the rest pass through); 0: all of head_dim.
  int64_t rotary_dim = 0;
  int64_t rope_dims() const { return rotary_dim > 0 ? rotary_dim : head_dim; }
};

struct Gpt2Config {
  int64_t vocab_size = 50257;
  int64_t n_positions = 1024;
  int64_t n_embd = 768;
  int64_t n_layer = 12;
  int64_t n_head = 12;
  int64_t n_inner = 0;    // 0: 4 * n_embd
  bool gelu_tanh = true;  // activation_function gelu_new (tanh) or gelu (erf)
  double layer_norm_epsilon = 1e-5;
  float resid_pdrop = 0.1f, embd_pdrop = 0.1f, attn_pdrop = 0.1f;
};

// Token ids the generation side needs (config.json, then generation_config.json).
struct GenerationConfig {
  std::vector<int64_t> eos_token_ids;
  int64_t bos_token_id = -1;  // -1: none
  // The sampling settings generation_config.json gives, where it gives them
  // (do_sample false: greedy): the programs' defaults (default_sampling in
  // kiln/generate.h). Unset: the file does not say.
  std::optional<bool> do_sample;
  std::optional<float> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
};

// A parsed config.json: exactly one of llama / gpt2.
struct ModelConfig {
  std::string model_type;
  std::optional<LlamaConfig> llama;
  std::optional<Gpt2Config> gpt2;
  GenerationConfig generation;
};

// Parses config.json text; `file` names it in errors: "[models] <file>: field
// 'x' ...". Unknown model types, unsupported fields and values are errors.
ModelConfig parse_config(std::string_view json, const std::string& file = "config.json");
ModelConfig read_config(const std::string& path);
// generation_config.json: its eos/bos ids replace those of config.json.
void parse_generation_config(std::string_view json, const std::string& file, GenerationConfig& g);
// The JSON text of a config (what save_pretrained writes).
std::string config_json(const ModelConfig& cfg);

// model.safetensors.index.json: tensor name -> shard file name (a plain file name
// in the same directory), in the index's order.
struct ShardIndex {
  std::vector<std::pair<std::string, std::string>> weight_map;
  std::vector<std::string> shards;  // distinct file names, first-use order
};
ShardIndex parse_shard_index(std::string_view json, const std::string& file);

// What load_pretrained measured.
struct LoadStats {
  double seconds = 0;          // reading, checking and converting the weights
  int64_t bytes_read = 0;      // tensor bytes of the files the params take (mapped or read)
  int64_t bytes_mapped = 0;    // of those, bytes the params use in place (memory-mapped)
  int64_t peak_rss_bytes = 0;  // the process's peak resident set afterwards (getrusage)
};

// One incremental forward pass over a key/value cache (what kiln::models::Generator,
// kiln/generate.h, builds a graph of): T new tokens at the given positions attend
// to the first `cached` rows of every layer's cache and to each other, as `mask` says.
struct KvStep {
  Tensor ids;          // i32 [1, T]
  Tensor positions;    // i32 [T]: each new token's position (RoPE / learned positions)
  Tensor mask;         // f32 [T, cached + T]: 0 where query t sees a key, -inf elsewhere
  Tensor last;         // i32 [1]: the new token whose logits the pass returns
  int64_t cached = 0;  // cache rows the pass reads
  std::vector<Tensor> k_cache, v_cache;  // per layer [S, kv_heads, 1, head_dim]
  std::vector<Tensor> k_new, v_new;      // set by forward_cached: per layer [T, kv_heads, head_dim]
  // Batched decoding (BatchGenerator): > 0 when the T = batch new tokens are
  // one token of each of `batch` sequences. The caches are then per layer
  // [sequences, S, kv_heads, head_dim], token b reads rows 0..cached-1 of
  // sequence b's cache, and mask is [batch, 1, 1, cached + 1].
  int64_t batch = 0;
};

// The shape of a model's key/value cache: per layer, kv_heads x head_dim per position.
struct KvLayout {
  int64_t layers = 0, kv_heads = 0, head_dim = 0;
};

// A causal language model: i32 token ids [B, T] -> f32 logits [B, T, vocab].
class CausalLM : public nn::Module {
 public:
  explicit CausalLM(Context& ctx) : Module(ctx) {}
  virtual int64_t vocab_size() const = 0;
  // The longest sequence forward() accepts.
  virtual int64_t max_seq_len() const = 0;
  virtual const ModelConfig& config() const = 0;
  // Tensors of HF files that are not parameters and that loading may skip
  // (GPT-2's causal-mask buffers, old RoPE inv_freq buffers, a tied head).
  virtual bool ignorable_tensor(const std::string& name) const = 0;
  // The file name a parameter may also have (GPT-2: "transformer." + name).
  virtual std::string alternate_name(const std::string& name) const { return {}; }
  // Incremental decoding: the cache's shape, and the graph of one pass over it
  // (logits [1, vocab] of step.last; fills step.k_new / v_new with the new rows
  // the caller appends to the caches). Same weights and arithmetic as forward().
  virtual KvLayout kv_layout() const = 0;
  virtual Tensor forward_cached(KvStep& step) = 0;
  // Packed examples (several sequences per row of ids [B, T], none seeing
  // another): i32 [B, T] segment ids (a run of equal ids is one example,
  // AttentionOptions::segments) and positions (each example's from 0, RoPE's
  // angles). Logits [B, T, vocab]; each example's are those forward() gives
  // for it alone. The Llama family packs (not with a sliding window or
  // attention dropout); supports_packing() says whether forward_packed works.
  virtual bool supports_packing() const { return false; }
  virtual Tensor forward_packed(Tensor ids, Tensor segments, Tensor positions);

  // Params (Module::allocate) and the model's constant tables (RoPE's cos/sin,
  // positions), which get memory here and are filled: call before building graphs.
  void allocate(Backend& backend) override;

  LoadStats load_stats;

  // Keeps a buffer params point into (a memory-mapped weight file) as long as
  // the model lives; the loaders call it.
  void keep_buffer(std::unique_ptr<Buffer> b) { kept_.push_back(std::move(b)); }

 protected:
  // A constant the model's graphs read (not a parameter: no gradient, not saved),
  // given memory and `values` by allocate().
  Tensor constant(const Shape& shape, std::vector<float> values, const std::string& name);
  // Throws unless the constants have memory (allocate was called).
  void check_allocated() const;

 private:
  std::vector<std::pair<Tensor, std::vector<float>>> constants_;
  std::unique_ptr<Buffer> constant_storage_;
  std::vector<std::unique_ptr<Buffer>> kept_;
};

// Options of building and loading.
struct ModelOptions {
  // Length of the RoPE tables (Llama family): positions forward() can take.
  // 0: min(max_position_embeddings, 4096).
  int64_t max_seq_len = 0;
  // Loading on a host backend (CPU, BLAS): params whose stored bytes are what
  // kiln needs (same dtype, same layout, aligned to the element size) point into
  // a private, copy-on-write memory map of the file instead of a copy: loading
  // reads no weights, pages come from the file (page cache) on first use, and a
  // training step writes the process's own copy of a page, never the file. The
  // map lives as long as the model. Other tensors (converted dtypes, GGUF's q/k
  // row order and GPT-2 transposes, quantized blocks) and other backends (CUDA)
  // get copies. false: every tensor is copied.
  bool mmap = true;
  // Weights stored as F16 or BF16. f32 (the default, as transformers'
  // from_pretrained without torch_dtype): every param is converted to f32.
  // stored: matrices (params of 2+ dims: embeddings, projections, the head)
  // keep the file's f16/bf16 (matmul and embedding read them as they are);
  // 1-D params (norm weights, biases) are f32 either way. Loading only.
  // q8_0, q4_0, q4_k, q6_k, ... (the rows of kiln/quant_types.def that matmul
  // reads as stored: today every row): the weights of Linear layers
  // (projections, MLPs, an untied head) and the token embedding (a tied head
  // reads it) whose rows are whole blocks are quantized as they load (ggml's
  // reference formulas) and frozen; make_model applies it too (init() writes
  // quantized values). GGUF tensors stored in a type matmul reads are kept as
  // stored (also with `stored`, on host backends); GGUF tensors of a type it
  // does not read are dequantized to f32 as they load, or quantized again to
  // the type asked for here (ggml's formulas, from the dequantized values). Norms,
  // biases and GPT-2's position embedding stay f32. matmul reads the blocks as
  // they are (x @ W^T and, for LoRA, dy @ W), embedding dequantizes the rows
  // it gathers.
  // bf16: matrices (as `stored` names them) converted to bf16 as they load
  // (rounded to nearest even; bf16 files kept as stored), half of f32's memory
  // and bytes per decoded token; 1-D params f32. For inference (kiln-lm
  // generate --precision bf16): kiln's optimizers update f32 params only.
  // Loading only.
  enum class WeightDType {
    f32,
    stored,
    bf16,
#define KILN_QUANT_TYPE(name, GGUF_NAME, gguf_id, block_elems, block_bytes, family, matmul) \
  KILN_QUANT_WEIGHT_DTYPE_##matmul(name)
#define KILN_QUANT_WEIGHT_DTYPE_qmatmul(name) name,
#define KILN_QUANT_WEIGHT_DTYPE_dequant(name)
#include "kiln/quant_types.def"
#undef KILN_QUANT_TYPE
#undef KILN_QUANT_WEIGHT_DTYPE_qmatmul
#undef KILN_QUANT_WEIGHT_DTYPE_dequant
  };
  WeightDType weight_dtype = WeightDType::f32;
};

// The WeightDType that quantizes to the type named `name` ("q8_0", "q4_k", ...:
// the rows of kiln/quant_types.def that matmul reads as stored), or nullopt; and
// their names (command-line choices).
std::optional<ModelOptions::WeightDType> quantized_weight_dtype_named(std::string_view name);
std::vector<std::string> quantized_weight_dtype_names();

// llama.cpp's quantization recipes (llama-quantize's file types, lower case):
// q2_k, q3_k_m, q4_0, q4_1, q4_k_s, q4_k_m, q5_0, q5_1, q5_k_s, q5_k_m, q6_k,
// q8_0. A recipe gives most matrices its base type and some more bits: the
// head (and a tied embedding) Q6_K (Q8_0 when its rows are not whole blocks of
// the base type), attn_v / ffn_down of the layers llama.cpp picks (Q4_K_M and
// Q5_K_M: Q6_K in the first and last eighth and every third layer between),
// and so on (src/models/quant_recipe.cpp, one comment per rule). A row that is
// not whole blocks of the type picked falls back to a 32-value type (Q2_K,
// Q3_K -> Q4_0; Q4_K -> Q5_0; Q5_K -> Q5_1; Q6_K -> Q8_0), or F16 when it is
// not whole blocks of 32 either. 1-D tensors (norms, biases), norms and
// position embeddings stay f32.
struct RecipeTensor {
  std::string name;  // its GGUF name: "token_embd.weight", "blk.3.attn_v.weight", ...
  Shape shape;       // kiln's order: the last dim is the row (ggml's ne[0])
};
// What a recipe reads of the model besides its tensors.
struct RecipeModel {
  int64_t n_layer = 0;  // block_count
  int64_t n_gqa = 1;    // attention heads per key-value head
  bool is_70b = false;  // what llama.cpp sizes as 70B (80 layers; Llama with grouped-query)
};
std::vector<std::string> quant_recipe_names();
bool is_quant_recipe(std::string_view name);
// general.file_type of a recipe's files (llama.cpp's LLAMA_FTYPE_MOSTLY_*), its base type.
uint32_t quant_recipe_file_type(std::string_view recipe);
DType quant_recipe_base_type(std::string_view recipe);
// The type of each tensor under `recipe`, in the order given: a block type, f16
// (rows not whole blocks of 32), or f32 (kept). The model is tied when no tensor
// is "output.weight". An unknown recipe is an error naming it.
std::vector<DType> quant_recipe_types(std::string_view recipe, const RecipeModel& model,
                                      const std::vector<RecipeTensor>& tensors);

// The Llama-family model (LlamaForCausalLM's layout and names).
std::unique_ptr<CausalLM> make_llama(Context& ctx, const ModelConfig& cfg,
                                     const ModelOptions& opt = {});
// GPT-2 (GPT2LMHeadModel's weights, named as the hub's files: "h.0.attn.c_attn.weight").
std::unique_ptr<CausalLM> make_gpt2(Context& ctx, const ModelConfig& cfg,
                                    const ModelOptions& opt = {});
// The model a config describes.
std::unique_ptr<CausalLM> make_model(Context& ctx, const ModelConfig& cfg,
                                     const ModelOptions& opt = {});

// Loads the model at `path`: a directory is a Hugging Face model directory
// (load_pretrained), a file a GGUF file (load_gguf). Anything else (a path that
// does not exist, a file that does not start with GGUF's magic) is a kiln::Error
// "[models] <path>: ..." saying what kiln expected.
std::unique_ptr<CausalLM> load(Context& ctx, Backend& backend, const std::string& path,
                               const ModelOptions& opt = {});

// Loads a Hugging Face model directory: config.json, generation_config.json (when
// present), model.safetensors or model.safetensors.index.json and its shards.
// F32, F16 and BF16 tensors are converted to f32 (or F16/BF16 matrices kept:
// opt.weight_dtype); on host backends those usable as stored are memory-mapped
// (opt.mmap), the rest copied. Every tensor the model needs is
// checked (present, loadable dtype, shape as the config implies) before any is
// written; a tensor the model does not use is an error too. Before the model is
// built, the files must hold a tensor of every layer the config asks for
// (num_hidden_layers / n_layer), so a config that asks for more layers fails at
// once naming the first missing one. Errors are kiln::Error "[models] <file>: ..."
// naming the file and the field or tensor.
std::unique_ptr<CausalLM> load_pretrained(Context& ctx, Backend& backend, const std::string& dir,
                                          const ModelOptions& opt = {});
// Loads the weights of `dir` into an allocated model (what load_pretrained does
// after building it).
void load_weights(CausalLM& model, const std::string& dir);

// GGUF files in llama.cpp's conventions: tensor names (token_embd.weight,
// blk.N.attn_q.weight, ...), metadata keys (general.architecture, llama.block_count,
// llama.rope.freq_base, ...), the Q/K row order llama.cpp's converter gives the
// "llama" architecture (its RoPE rotates adjacent pairs; HF's the two halves of a
// head), GPT-2's linear weights [out, in], and Llama 3's RoPE scaling as the
// rope_freqs tensor, linear and YaRN scaling as the rope.scaling.* keys (dynamic and
// longrope have no GGUF form: save_gguf refuses them), every layer block_count
// asks for present before the model is built. F32, F16 and BF16 tensors are
// converted to f32 (or kept,
// opt.weight_dtype), Q8_0 and Q4_0 tensors dequantized to f32, and tensors
// usable as stored memory-mapped on host backends (opt.mmap) (load_gguf;
// save_gguf writes f32). Errors:
// kiln::Error "[models] <file>: ..." naming the key or tensor.
std::unique_ptr<CausalLM> load_gguf(Context& ctx, Backend& backend, const std::string& path,
                                    const ModelOptions& opt = {});
// The ModelConfig a GGUF file's metadata (and rope_freqs tensor) describes.
ModelConfig read_gguf_config(const std::string& path);
// Writes `model` (f32 tensors) with llama.cpp's names and metadata, atomically.
// With a tokenizer, its vocabulary goes in too (the tokenizer.ggml.* keys of
// Tokenizer::write_gguf_vocab: model "llama" or "gpt2", tokens, scores,
// token_type, merges, bos/eos ids, add_bos_token), so llama.cpp can run the file
// and Tokenizer::from_gguf rebuild the tokenizer. Its vocabulary must have
// exactly the model's vocab_size tokens; the model's generation config, when it
// names bos/eos ids, overrides the tokenizer's. Without one, only the bos/eos ids
// of the generation config are written.
// With a `recipe` (quant_recipe_names()), the tensors get the recipe's types
// (quant_recipe_types for this model), quantized from the params' values (f32,
// or dequantized; a param already of the type picked is written as it is), and
// general.file_type is the recipe's; GPT-2's file then has no output.weight
// (llama.cpp reads the head from token_embd), so the tied table is the head's
// type once.
void save_gguf(const CausalLM& model, const std::string& path, const Tokenizer* tokenizer = nullptr,
               std::string_view recipe = {});
// The GGUF tensors save_gguf writes for `model` with `recipe`, each with its type.
std::vector<std::pair<std::string, DType>> quant_recipe_types(std::string_view recipe,
                                                              const CausalLM& model);

// A copy of `model` (built in `ctx`, allocated on `backend`) whose vocabulary
// holds `vocab_size` tokens: transformers' model.resize_token_embeddings(n)
// after tokenizer.add_special_tokens(...). Every param is copied; the params
// with a row per token (the embedding, an untied head) keep their first rows,
// and rows beyond the old vocabulary are the mean of the old rows
// (transformers' mean_resizing, without its small random spread), so a new
// token starts as an average token instead of noise that would dominate the
// softmax. A smaller vocab_size drops the last rows. The params must be f32
// (a quantized or f16 model is an error: resize the f32 model, then quantize).
std::unique_ptr<CausalLM> resize_token_embeddings(Context& ctx, Backend& backend,
                                                  const CausalLM& model, int64_t vocab_size);

// Writes `model` as a Hugging Face directory (config.json, generation_config.json,
// model.safetensors in the params' dtypes: f32, or f16/bf16 kept), each file
// atomically; creates `dir` if needed.
void save_pretrained(const CausalLM& model, const std::string& dir);

}  // namespace kiln::models
