// kiln::nn (docs/design.md, "nn"): models as modules that own named parameters
// and sub-modules, and the usual layers, initialised like PyTorch's.
//
//   struct Mlp : kiln::nn::Module {
//     kiln::nn::Linear& fc1;
//     kiln::nn::Linear& fc2;
//     explicit Mlp(kiln::Context& ctx)
//         : Module(ctx), fc1(add<kiln::nn::Linear>("fc1", 784, 500)),
//           fc2(add<kiln::nn::Linear>("fc2", 500, 10)) {}
//     kiln::Tensor forward(kiln::Tensor x) override { return fc2(kiln::relu(fc1(x))); }
//   };
//
//   kiln::Context ctx;
//   Mlp model(ctx);                 // params fc1.weight, fc1.bias, fc2.weight, fc2.bias
//   kiln::CpuBackend cpu;
//   model.allocate(cpu);            // one buffer, owned by the model
//   model.init(/*seed=*/1);         // PyTorch's default init, seeded
//   kiln::Tensor xt = ctx.input(kiln::f32, {64, 784});   // training graph, batch 64
//   kiln::Tensor yt = model(xt);
//   model.eval();                   // graphs built from now on: dropout off
//   kiln::Tensor xg = ctx.input(kiln::f32, {1, 784});    // evaluation graph, batch 1
//   kiln::Tensor yg = model(xg);    // the same weights: nothing copied
//
// Modules are built in a Context: their params are ctx.param tensors of it, so
// every graph built from that context (any batch size, training or evaluation)
// reads the same weights. A module is a graph *builder*: forward() adds nodes
// and computes nothing.
//
// Ownership: a module owns its sub-modules (add() creates them on the heap; the
// reference it returns stays valid for the parent's life, also across a move),
// and, after allocate(), the buffer holding its params. Modules are movable
// (construction only) and not copyable: a copy would either share the weights
// behind the user's back or need a second buffer; build a second model instead.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/context.h"
#include "kiln/nn/init.h"
#include "kiln/ops.h"
#include "kiln/tensor.h"

namespace kiln::nn {

class Module {
 public:
  explicit Module(Context& ctx);
  virtual ~Module();
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;
  Module(Module&&) noexcept;
  Module& operator=(Module&&) = delete;

  Context& ctx() const { return *ctx_; }
  // PyTorch's class name ("Linear"), used in messages.
  virtual const char* type_name() const { return "Module"; }

  // Builds this module's graph for input x. The default throws kiln::Error: a
  // module without a one-tensor forward (a container of parts) cannot be called.
  virtual Tensor forward(Tensor x);
  // forward(x), marked as a checkpoint when set_checkpoint() is on.
  Tensor operator()(Tensor x);

  // Gradient checkpointing per module: graphs built afterwards mark this
  // module's output as a checkpoint (kiln::checkpoint): the backward pass keeps
  // it and recomputes what lies between it and the previous checkpoint. Mark
  // every block of a stack (or every k-th) for the usual memory-for-compute trade.
  void set_checkpoint(bool on = true) { checkpoint_ = on; }
  bool checkpointed() const { return checkpoint_; }

  // ---- parameters ----
  // Every parameter of the tree with its hierarchical name ("blocks.0.attn.c_attn.weight"):
  // this module's own params in registration order, then each sub-module's, in
  // registration order (PyTorch's order). A tensor used twice (weight tying) is
  // listed once, under its first name.
  std::vector<std::pair<std::string, Tensor>> named_parameters() const;
  std::vector<Tensor> parameters() const;
  // The params that get gradients (Tensor::requires_grad): what an optimizer
  // trains. OptConfig::model and weight_decay_groups use these.
  std::vector<Tensor> trainable_parameters() const;
  // named_parameters() without the params of adapters (LoRA, kiln/nn/lora.h):
  // the model's own weights, as its checkpoint files hold them.
  std::vector<std::pair<std::string, Tensor>> named_base_parameters() const;

  // ---- frozen parameters (PyTorch's requires_grad_) ----
  // Every param of the tree stops (freeze) or starts (unfreeze) getting
  // gradients: a frozen param gets no gradient node, accumulator, gradient
  // memory or optimizer state in backward passes and OptContexts built
  // afterwards, and gradients still flow through it to trainable params below.
  // One param: parameter("fc1.weight").set_requires_grad(false).
  void freeze() { set_requires_grad(false); }
  void unfreeze() { set_requires_grad(true); }
  void set_requires_grad(bool on);
  // This module's own params (local names), and its direct sub-modules.
  const std::vector<std::pair<std::string, Tensor>>& own_parameters() const { return params_; }
  std::vector<std::pair<std::string, Module*>> named_children() const;
  // This module's path in the tree ("" for the root, "blocks.0.attn" below).
  std::string path() const;
  // Marks this sub-tree as an adapter's (LoRA): named_base_parameters() skips it.
  void mark_adapter() { adapter_ = true; }
  bool is_adapter() const { return adapter_; }
  // The parameter or sub-module called `name` ("fc1.weight" walks down); throws
  // kiln::Error "[nn] ..." naming the missing part.
  Tensor parameter(std::string_view name) const;
  Module& child(std::string_view name) const;

  // Weight tying: makes this module's param `name` the tensor `shared` (same
  // dtype and shape, same context), e.g. lm_head.tie("weight", wte.weight()).
  // Every graph built afterwards reads `shared`; its gradient is the sum over
  // both uses. The replaced tensor is dropped from named_parameters().
  void tie(std::string_view name, Tensor shared);

  // ---- state dicts (files through kiln/state_dict.h; see docs/design.md, "nn") ----
  // named_parameters(): the tensors a model file holds, under these names.
  std::vector<std::pair<std::string, Tensor>> state_dict() const { return named_parameters(); }
  // Writes every param (which must have memory) to `path` atomically. The
  // format follows the extension: ".safetensors" or ".gguf".
  void save(const std::string& path) const;
  // What a non-strict load left out: model params the file lacks, file tensors
  // the model lacks.
  struct LoadResult {
    std::vector<std::string> missing, unexpected;
  };
  // Loads params by name from a ".safetensors" or ".gguf" file. Everything is
  // checked before anything is written: a missing or unexpected name (strict),
  // or a dtype or shape that differs (always), throws kiln::Error naming the
  // file and the first mismatch and leaves every param as it was; so does a
  // corrupt file. strict=false loads the names both sides have and lists the
  // rest. Params must have memory.
  LoadResult load(const std::string& path, bool strict = true);

  // Replaces the param `name` (a dotted path below this module; it must have no
  // memory yet) by a param of `dtype` with the same shape and tensor name,
  // wherever this tree uses it (a tied tensor stays tied). For weights kept as
  // stored (f16/bf16 matrices read by matmul). Graphs built before read the old
  // tensor: call it before building any. Returns the new param.
  Tensor set_parameter_dtype(std::string_view name, DType dtype);
  // The same for many params at once (the loaders: one walk of the tree for all
  // of them, where one call per param would walk it once per param). Returns the
  // new params in the order of `changes`.
  std::vector<Tensor> set_parameter_dtypes(
      const std::vector<std::pair<std::string, DType>>& changes);
  // The same for a param that has memory: the new one (same name, shape and
  // frozen flag) gets memory of the old one's buffer type, kept by this module;
  // its values are the caller's to write. (merge_lora keeps a dequantized,
  // merged base weight f32 this way.) Graphs built before read the old tensor.
  Tensor reallocate_parameter(std::string_view name, DType dtype);

  // ---- memory and initialisation ----
  // Gives every param of the tree that has no memory yet a place in one new
  // zero-filled buffer of `backend`, owned by this module (call on the root).
  // Params that already have memory keep it. Graphs and OptContexts built
  // later leave these params where they are, so they all share the weights.
  // Virtual so that a model with constant tables (kiln::models) places them too.
  virtual void allocate(Backend& backend);
  // Re-initialises every param of the tree with each layer's default init
  // (reset_parameters). Each module's seed is derived from `seed` and its path,
  // so a layer's values depend on its name, not on how many layers came first.
  // A tied tensor is written by each of its owners in tree order (the last wins).
  // Params must have memory (allocate first).
  void init(uint64_t seed);
  // This module's own params only; the seed is already the module's own.
  virtual void reset_parameters(uint64_t /*seed*/) {}

  // ---- training vs evaluation ----
  // The mode is read when a graph is built (PyTorch's module.train()/eval()):
  // Dropout adds its mask only to graphs built in training mode. Applies to the
  // whole tree. New modules start in training mode.
  void train(bool on = true);
  void eval() { train(false); }
  bool training() const { return training_; }

  // Dropout's per-step seed tensors (i32 [1], one per Dropout that built a
  // training graph). Writing a new value before each training step gives new
  // masks without rebuilding the graph; OptContext does this itself when given
  // the module (OptConfig::model). set_dropout_step writes `step` into each one
  // that has memory.
  std::vector<Tensor> dropout_seeds() const;
  void set_dropout_step(int64_t step);

 protected:
  // A new f32 param called `name` (no '.', unique in this module), zero until
  // init(). Its tensor name is the hierarchical one once the module is placed.
  Tensor register_parameter(std::string name, const Shape& shape);
  // Adopts a sub-module under `name`; returns it.
  template <class M>
  M& register_module(std::string name, std::unique_ptr<M> m) {
    M& ref = *m;
    adopt(std::move(name), std::unique_ptr<Module>(std::move(m)));
    return ref;
  }
  // Creates a sub-module M(ctx(), args...) under `name`.
  template <class M, class... Args>
  M& add(std::string name, Args&&... args) {
    return register_module(std::move(name),
                           std::make_unique<M>(*ctx_, std::forward<Args>(args)...));
  }
  // The i-th own param (registration order), as tie() left it.
  Tensor own(size_t i) const { return params_[i].second; }
  // The number of direct sub-modules, and the i-th (registration order), without
  // copying the list as named_children() does.
  size_t child_count() const { return children_.size(); }
  Module& child_at(size_t i) const { return *children_[i].second; }
  // A seed tensor for this module's Dropout (created on first use).
  Tensor dropout_seed_tensor();
  // A seed that depends on this module's path (dropout's static seed).
  uint64_t path_seed() const;

 private:
  void adopt(std::string name, std::unique_ptr<Module> m);
  void check_new_name(const std::string& name) const;
  void set_prefix(const std::string& prefix);
  void collect(std::vector<std::pair<std::string, Tensor>>& out,
               std::unordered_set<const TensorNode*>& seen, bool adapters) const;
  void init_tree(uint64_t seed);
  void replace_params(const std::unordered_map<const TensorNode*, Tensor>& now);

  Context* ctx_;
  std::string prefix_;  // path + "." ("" for the root)
  std::vector<std::pair<std::string, Tensor>> params_;
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
  std::unordered_map<std::string, size_t> param_pos_, child_pos_;  // name -> index
  Tensor seed_;  // dropout's step seed (undefined until needed)
  bool training_ = true;
  bool checkpoint_ = false;
  bool adapter_ = false;
  std::vector<std::unique_ptr<Buffer>> storage_;  // from allocate()
};

// ---------------------------------------------------------------------------
// Primitives the layers build on. Attention is the fused kiln::attention, in
// training with dropout on its weights too (AttentionOptions::dropout).
// Options of scaled_dot_product_attention: kiln::AttentionOptions (the fused
// primitive's) plus the training flag, and causal by default.
struct SdpaOptions {
  bool causal = true;
  float scale = 0.0f;    // 0: 1/sqrt(head dim)
  float dropout = 0.0f;  // on the attention weights, when training
  bool training = false;
  uint64_t seed = 0;   // dropout's static seed
  Tensor seed_tensor;  // dropout's per-step seed (i32, optional)
  // The composite matmul -> softmax -> dropout -> matmul instead of the fused
  // primitive (the same mask with the same seeds): for comparisons and
  // benchmarks of the fused kernels, never needed for results.
  bool composite = false;
};
// q, k, v [B, H, T, D] -> softmax(q k^T * scale (+ causal mask)) v, [B, H, T, D].
Tensor scaled_dot_product_attention(Tensor q, Tensor k, Tensor v, const SdpaOptions& opt = {});

// ---------------------------------------------------------------------------
// Layers. Shapes follow PyTorch: weights [out, in], inputs [..., features].

class Linear;
class Dropout;

// merge_lora on a quantized (q8_0/q4_0) base weight: it is dequantized and the
// adapter merged in f32; the weight then stays f32 (a new param) unless
// `requantize` asks to quantize it again to its dtype.
struct MergeOptions {
  bool requantize = false;
};
// What merge_lora did to quantized base weights, and the error re-quantizing
// added: |requantized - merged f32| over every value of the requantized weights.
struct MergeReport {
  int64_t kept_f32 = 0, requantized = 0;  // quantized (or f16/bf16) base weights, by outcome
  double max_error = 0, sum_sq_error = 0, max_abs_merged = 0;
  int64_t values = 0;
  double rms_error() const;
};

// The layers LoRA adapters attach to (kiln/nn/lora.h): y = x W^T + b with
// weight [out, in] (Linear), or y = x W + b with weight [in, out] when
// fan_in_fan_out (Hugging Face's Conv1D, GPT-2's layers). With an active,
// unmerged adapter, graphs built add scaling * B(A(dropout(x))).
class LinearBase : public Module {
 public:
  Tensor forward(Tensor x) override;  // [..., in] -> [..., out]
  Tensor weight() const { return own(0); }
  Tensor bias() const { return has_bias_ ? own(1) : Tensor(); }
  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool fan_in_fan_out() const { return fan_in_fan_out_; }

  // One LoRA adapter of this layer: lora_A.<name> (Linear in -> r, weight
  // [r, in]), lora_B.<name> (Linear r -> out, weight [out, r]) and
  // lora_dropout.<name>, PEFT's module names. kiln/nn/lora.h manages them.
  struct Lora {
    std::string name;
    int64_t r = 0;
    float alpha = 0, dropout = 0, scaling = 0;
    bool use_rslora = false;
    std::vector<std::string> target_modules;  // the adapter's config, as given
    std::string target_regex;
    Linear* A = nullptr;
    Linear* B = nullptr;
    Dropout* drop = nullptr;
  };
  const std::vector<Lora>& loras() const { return loras_; }
  const Lora* find_lora(std::string_view name) const;
  Lora& add_lora(const std::string& name, int64_t r, float alpha, float dropout, bool use_rslora);
  // The adapter graphs add ("" none); throws while one is merged.
  void set_active_lora(const std::string& name);
  const std::string& active_lora() const { return active_; }
  // W += scaling * B A (transposed for fan_in_fan_out) for the active adapter,
  // which graphs built afterwards then leave out; unmerge subtracts it again.
  // Computed on the host in double precision (params must have memory).
  // A quantized W: merged in f32, kept f32 or quantized again (MergeOptions),
  // counted in `report`. unmerge of such a weight leaves it as it is (f32, or
  // the requantized blocks) minus the delta: the original up to rounding.
  void merge_lora(const MergeOptions& opt = {}, MergeReport* report = nullptr);
  void unmerge_lora();
  bool lora_merged() const { return merged_; }

 protected:
  LinearBase(Context& ctx, int64_t in_features, int64_t out_features, bool bias,
             bool fan_in_fan_out);

 private:
  void add_delta(const Lora& a, double sign, const MergeOptions& opt = {},
                 MergeReport* report = nullptr);
  int64_t in_, out_;
  bool has_bias_, fan_in_fan_out_;
  std::vector<Lora> loras_;
  std::string active_;
  bool merged_ = false;
};

// y = x W^T + b. W [out, in] and b [out] ~ U(-1/sqrt(in), 1/sqrt(in)) (PyTorch's
// kaiming_uniform(a=sqrt(5)) and bias rule).
class Linear : public LinearBase {
 public:
  Linear(Context& ctx, int64_t in_features, int64_t out_features, bool bias = true);
  const char* type_name() const override { return "Linear"; }
  void reset_parameters(uint64_t seed) override;
};

// conv2d with weight [out, in, k, k] and bias [out] ~ U(-1/sqrt(fan_in),
// 1/sqrt(fan_in)), fan_in = in * k * k (PyTorch's rule).
class Conv2d : public Module {
 public:
  Conv2d(Context& ctx, int64_t in_channels, int64_t out_channels, int64_t kernel_size,
         Conv2dOptions opt = {}, bool bias = true);
  const char* type_name() const override { return "Conv2d"; }
  Tensor forward(Tensor x) override;  // [N, in, H, W] -> [N, out, OH, OW]
  void reset_parameters(uint64_t seed) override;
  Tensor weight() const { return own(0); }
  Tensor bias() const { return has_bias_ ? own(1) : Tensor(); }

 private:
  Conv2dOptions opt_;
  bool has_bias_;
};

// Rows of weight [num, dim] ~ N(0, 1) (PyTorch's default) at i32 indices.
class Embedding : public Module {
 public:
  Embedding(Context& ctx, int64_t num_embeddings, int64_t embedding_dim);
  const char* type_name() const override { return "Embedding"; }
  Tensor forward(Tensor indices) override;  // i32 [...] -> [..., dim]
  void reset_parameters(uint64_t seed) override;
  Tensor weight() const { return own(0); }
};

// Over the last axis; weight [dim] = 1, bias [dim] = 0 (PyTorch's default).
class LayerNorm : public Module {
 public:
  LayerNorm(Context& ctx, int64_t dim, float eps = 1e-5f, bool affine = true, bool bias = true);
  const char* type_name() const override { return "LayerNorm"; }
  Tensor forward(Tensor x) override;
  void reset_parameters(uint64_t seed) override;
  Tensor weight() const { return affine_ ? own(0) : Tensor(); }
  Tensor bias() const { return has_bias_ ? own(1) : Tensor(); }

 private:
  float eps_;
  bool affine_, has_bias_;
};

// x / sqrt(mean(x^2) + eps) * weight over the last axis; weight [dim] = 1.
// eps defaults to 1e-6 (LLaMA's; PyTorch's None means the dtype's epsilon).
class RMSNorm : public Module {
 public:
  RMSNorm(Context& ctx, int64_t dim, float eps = 1e-6f, bool affine = true);
  const char* type_name() const override { return "RMSNorm"; }
  Tensor forward(Tensor x) override;
  void reset_parameters(uint64_t seed) override;
  Tensor weight() const { return affine_ ? own(0) : Tensor(); }

 private:
  float eps_;
  bool affine_;
};

// Zeroes elements with probability p and scales the rest by 1/(1-p) in graphs
// built in training mode; the identity (no node at all) in evaluation mode.
// The mask depends on the module's path and its step seed (dropout_seeds()).
class Dropout : public Module {
 public:
  Dropout(Context& ctx, float p = 0.5f);
  const char* type_name() const override { return "Dropout"; }
  Tensor forward(Tensor x) override;
  float p() const { return p_; }

 private:
  float p_;
};

// Parameter-free layers, so Sequential can hold them.
class ReLU : public Module {
 public:
  explicit ReLU(Context& ctx) : Module(ctx) {}
  const char* type_name() const override { return "ReLU"; }
  Tensor forward(Tensor x) override { return relu(x); }
};
class GELU : public Module {
 public:
  explicit GELU(Context& ctx, GeluApprox approx = GeluApprox::none)
      : Module(ctx), approx_(approx) {}
  const char* type_name() const override { return "GELU"; }
  Tensor forward(Tensor x) override { return gelu(x, approx_); }

 private:
  GeluApprox approx_;
};
// [N, ...] -> [N, rest] (PyTorch's nn.Flatten with start_dim 1).
class Flatten : public Module {
 public:
  explicit Flatten(Context& ctx) : Module(ctx) {}
  const char* type_name() const override { return "Flatten"; }
  Tensor forward(Tensor x) override;
};
class MaxPool2d : public Module {
 public:
  MaxPool2d(Context& ctx, Pool2dOptions opt = {}) : Module(ctx), opt_(opt) {}
  const char* type_name() const override { return "MaxPool2d"; }
  Tensor forward(Tensor x) override { return max_pool2d(x, opt_); }

 private:
  Pool2dOptions opt_;
};

// Sub-modules by name, added at any time (PyTorch's nn.ModuleDict; LoRA's
// lora_A / lora_B / lora_dropout hold one module per adapter name).
class ModuleDict : public Module {
 public:
  explicit ModuleDict(Context& ctx) : Module(ctx) {}
  const char* type_name() const override { return "ModuleDict"; }
  using Module::add;
};

// Modules applied in order, named "0", "1", ... (PyTorch's nn.Sequential; also
// the list of transformer blocks: "blocks.0.attn...").
class Sequential : public Module {
 public:
  explicit Sequential(Context& ctx) : Module(ctx) {}
  const char* type_name() const override { return "Sequential"; }
  template <class M, class... Args>
  M& push_back(Args&&... args) {
    return add<M>(std::to_string(size()), std::forward<Args>(args)...);
  }
  Module& push_back(std::unique_ptr<Module> m);
  Tensor forward(Tensor x) override;
  size_t size() const;
  Module& operator[](size_t i) const;
};

// nanoGPT's attention: c_attn (dim -> 3 dim, q|k|v), heads of dim/n_head, causal
// softmax, attention-weight dropout, c_proj (dim -> dim), residual dropout.
class CausalSelfAttention : public Module {
 public:
  CausalSelfAttention(Context& ctx, int64_t dim, int64_t n_head, float dropout = 0.0f,
                      bool bias = true);
  const char* type_name() const override { return "CausalSelfAttention"; }
  Tensor forward(Tensor x) override;  // [B, T, dim] -> [B, T, dim]
  Linear& c_attn;
  Linear& c_proj;
  Dropout& resid_dropout;

 private:
  int64_t dim_, n_head_;
  float dropout_;
};

// nanoGPT's MLP: c_fc (dim -> 4 dim), exact GELU, c_proj (4 dim -> dim), dropout.
class Mlp : public Module {
 public:
  Mlp(Context& ctx, int64_t dim, float dropout = 0.0f, bool bias = true);
  const char* type_name() const override { return "Mlp"; }
  Tensor forward(Tensor x) override;
  Linear& c_fc;
  Linear& c_proj;
  Dropout& dropout;
};

// Pre-LN block: x + attn(ln_1(x)), then + mlp(ln_2(x)) (nanoGPT's Block; param
// names ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc, mlp.c_proj).
class TransformerBlock : public Module {
 public:
  TransformerBlock(Context& ctx, int64_t dim, int64_t n_head, float dropout = 0.0f,
                   bool bias = true);
  const char* type_name() const override { return "TransformerBlock"; }
  Tensor forward(Tensor x) override;  // [B, T, dim] -> [B, T, dim]
  LayerNorm& ln_1;
  CausalSelfAttention& attn;
  LayerNorm& ln_2;
  Mlp& mlp;
};

}  // namespace kiln::nn
