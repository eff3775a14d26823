// Training (docs/design.md, "Training"): optimizers as graph ops, learning-rate
// schedules, the optimization context (forward, backward and optimizer graphs
// built and allocated once), epoch()/fit() with result objects, a progress bar,
// and checkpoints of weights plus optimizer state.
//
//   kiln::Context ctx;
//   kiln::Tensor x = ctx.input(kiln::f32, {500, 784}, "images");
//   kiln::Tensor w1 = ctx.param(kiln::f32, {784, 500}, "fc1.weight"); ...
//   kiln::Tensor logits = kiln::matmul(kiln::relu(kiln::matmul(x, w1) + b1), w2) + b2;
//
//   kiln::OptContext opt({.inputs = x, .outputs = logits,
//                         .loss = kiln::LossKind::cross_entropy,
//                         .logical_batch = 1000});      // 2 physical batches per step
//   kiln::kaiming_uniform(w1, 784, /*seed=*/1); ...      // params have memory now
//   auto history = kiln::fit(opt, dataset, {.epochs = 30, .val_split = 0.05});
//   opt.save("model.gguf");                              // weights + m, v, step
//
// Per step the context only uploads a batch, writes the step's hyper-parameters
// (a small f32 tensor: learning rate, betas, bias corrections) and computes;
// nothing is allocated or planned (principle 7). The step's values come from a
// schedule callback (principle 2: never baked into op params).
#pragma once
#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/dataset.h"
#include "kiln/graph.h"
#include "kiln/graph_passes.h"
#include "kiln/io.h"
#include "kiln/memory_plan.h"
#include "kiln/nn.h"
#include "kiln/optim_hyper.h"
#include "kiln/tensor.h"

namespace kiln {

// ---------------------------------------------------------------------------
// Optimizer step ops (Op::ADAMW_STEP / SGD_STEP, see kiln/ops.def). Each
// returns a node that updates `param` in place (it aliases param) and rewrites
// the state tensors. `hp` holds the step's values: an f32 tensor laid out as
// AdamWHyper / SgdHyper (kiln/optim_hyper.h; hyper_floats<H> elements), written
// before each step, e.g. hp.set(hyper_values(adamw_hyper(p, t))).
// param, grad and state are f32 of one shape; param must not be a view.
Tensor adamw_step(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor hp);
// Multi-tensor AdamW (Op::ADAMW_STEP_MULTI): every param of a flat buffer in
// one node. `param` is f32 [P] (a flat view of the params' memory; the node
// aliases it), `grad`, `m` and `v` f32 [N] laid out alike, `hp` f32
// [G, hyper_floats<AdamWHyper>] (one row per param group), `segs` i32 [S, 4],
// one row (param offset, state offset, length, group) per param: elements
// param[po + j] and grad/m/v[so + j], j < length, take adamw_step's update with
// hp row `group`. The rows are data (written after allocation): state offsets
// ascending and ranges disjoint and in bounds, which the kernels check (CPU:
// kiln::Error) or assume (CUDA). OptContext builds this for its params.
Tensor adamw_step_multi(Tensor param, Tensor grad, Tensor m, Tensor v, Tensor hp, Tensor segs);
// `buf` (momentum buffer) may be undefined: plain SGD without momentum.
Tensor sgd_step(Tensor param, Tensor grad, Tensor buf, Tensor hp);

enum class OptimizerType { adamw, sgd };
const char* optimizer_name(OptimizerType t);

// torch.optim.AdamW's hyper-parameters. weight_decay defaults to 0 (ggml's
// default) rather than PyTorch's 0.01, so the MNIST setup matches ggml's example.
struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param *= 1 - lr * weight_decay
};
// torch.optim.SGD's: weight decay is L2 (added to the gradient).
struct SgdParams {
  float lr = 1e-2f;
  float momentum = 0.0f;
  float dampening = 0.0f;
  float weight_decay = 0.0f;
  bool nesterov = false;
};
// What a schedule returns for one step: the active optimizer reads its part.
struct OptimizerParams {
  AdamWParams adamw;
  SgdParams sgd;
  float lr() const;                   // adamw.lr (the one shown by progress output)
  OptimizerParams& set_lr(float lr);  // both optimizers' lr
};

// The hp tensor's values for one step. `t` is the 1-based optimizer step (bias
// corrections 1/(1-beta^t)); grad_scale multiplies the gradient (1/physical
// batches per step).
AdamWHyper adamw_hyper(const AdamWParams& p, int64_t t, float grad_scale = 1.0f);
SgdHyper sgd_hyper(const SgdParams& p, bool first_step, float grad_scale = 1.0f);

// ---------------------------------------------------------------------------
// Schedules: a callback gets the step about to be taken and returns that step's
// optimizer parameters. Ready-made ones in kiln::schedule.
struct StepInfo {
  int64_t step = 0;             // optimizer steps taken before this one (0, 1, ...)
  int64_t epoch = 0;            // current epoch (0-based)
  int64_t steps_per_epoch = 0;  // 0 when unknown (outside fit)
  int64_t epochs = 0;           // epochs of the run (0 when unknown)
  int64_t total_steps() const { return steps_per_epoch * epochs; }
};
using ScheduleFn = std::function<OptimizerParams(const StepInfo&)>;

namespace schedule {
// The same parameters every step.
ScheduleFn constant(OptimizerParams p = {});
// lr * gamma^(epoch / every_epochs) (torch.optim.lr_scheduler.StepLR, per epoch).
ScheduleFn step_decay(OptimizerParams p, int64_t every_epochs, float gamma);
// Linear warm-up (step s < warmup_steps gets lr (s+1)/warmup_steps), then a
// cosine decay from lr to min_lr at total_steps (0: StepInfo::total_steps(),
// known inside fit). Steps past the end stay at min_lr.
ScheduleFn cosine(OptimizerParams p, int64_t warmup_steps, float min_lr = 0.0f,
                  int64_t total_steps = 0);
}  // namespace schedule

// Param initialisers (init_uniform, init_normal, kaiming_uniform,
// xavier_uniform) are in kiln/nn/init.h, included here.

// ---------------------------------------------------------------------------
// Loss and accuracy over batches, with statistical uncertainties.
struct Result {
  int64_t n_samples = 0;
  int64_t n_batches = 0;
  double loss_sum = 0;     // of batch_loss * batch_size (a partial batch weighs less)
  double loss_sq_sum = 0;  // of batch_loss^2 * batch_size
  int64_t n_correct = -1;  // -1: no accuracy (regression losses)

  void add(double batch_loss, int64_t batch_size, int64_t correct = -1);
  void clear() { *this = Result{}; }
  // Mean loss per sample (the batch losses weighted by their sizes), and its
  // standard error from the spread of the batch losses (NaN below two batches).
  double loss() const;
  double loss_unc() const;
  bool has_accuracy() const { return n_correct >= 0; }
  double accuracy() const;      // in [0, 1] (NaN without accuracy)
  double accuracy_unc() const;  // sqrt(p (1 - p) / n)
};

// ---------------------------------------------------------------------------
// Data parallelism. The training layer comes before the distributed one
// (docs/design.md, "Layers"), so it defines only this hook and knows nothing of MPI;
// kiln::dist::DataParallel (kiln/dist.h) implements it. With a hook the context
// broadcasts params and optimizer state from rank 0 before its first forward
// pass (and after load()), tells the hook when the backward pass before an
// optimizer step has finished gradients, waits for their sum over ranks before
// stepping (scaling by 1/(batches * ranks), so the step averages), and saves
// checkpoints on rank 0 only; fit(), epoch() and evaluate() give each rank its
// own slice of every batch and sum the results over ranks.
class ParallelHook {
 public:
  virtual ~ParallelHook() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Once per context, after allocation. `grads`: the gradient accumulators in
  // the order the backward pass finishes them (last layer first; params without
  // a gradient left out), placed one after the other in memory in that order.
  // Returns cut points: ascending counts of grads after which the context pauses
  // the backward pass to call grads_ready(count); the last must be grads.size().
  virtual std::vector<size_t> attach(std::span<const Tensor> grads) = 0;
  // The backward pass before an optimizer step has finished grads[0, count).
  virtual void grads_ready(size_t count) = 0;
  // Before the optimizer step: returns once every gradient holds its sum over ranks.
  virtual void finish_grads() = 0;
  // Copies the tensors' values from rank 0 to every rank.
  virtual void broadcast(std::span<const Tensor> tensors) = 0;
  // Sums each value over ranks, in place (every rank gets the sums).
  virtual void sum(std::span<double> values) = 0;
};

// ---------------------------------------------------------------------------
// The optimization context.
enum class LossKind {
  cross_entropy,  // outputs are logits [B, C]; labels i32 [B] or f32 [B, C]
  mse,            // mean((outputs - labels)^2); labels shaped like outputs
  user,           // OptConfig::user_loss, a one-element f32 tensor
};

// A set of params with its own weight decay (PyTorch's param_groups). Unset:
// the schedule's weight_decay.
struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<float> weight_decay;
};
// The split every GPT recipe uses (nanoGPT's configure_optimizers): params with
// 2 or more dims (matmul and conv weights, embeddings) decay by `weight_decay`,
// the others (biases, norm weights) do not. Groups in that order; an empty
// group is left out, and so are frozen params (Tensor::requires_grad false).
std::vector<ParamGroup> weight_decay_groups(const nn::Module& model, float weight_decay);

struct OptConfig {
  Tensor inputs;   // a leaf [B, ...]: the physical batch, written per batch
  Tensor outputs;  // the model's output computed from inputs
  // A leaf; undefined: created (i32 [B] for cross-entropy, f32 like outputs for mse).
  Tensor labels;
  LossKind loss = LossKind::cross_entropy;
  Tensor user_loss;  // LossKind::user
  std::vector<Tensor>
      params;  // trained params; empty: see groups, model, else every param the loss depends on
  // Params in groups with their own weight decay (instead of `params`).
  std::vector<ParamGroup> groups;
  // The model the outputs come from (nn::Module). With neither params nor
  // groups, its trainable_parameters() are trained (frozen ones get no
  // gradient and no optimizer state). Its Dropout layers' step seeds are
  // written before every training pass, so each batch gets new masks. It must
  // outlive the context.
  const nn::Module* model = nullptr;
  // > 0: before each optimizer step, scale every gradient by
  // max_norm / (total_norm + 1e-6) when the total L2 norm over all gradients
  // exceeds max_norm (torch.nn.utils.clip_grad_norm_). Computed by graph ops,
  // so it runs on any backend; grad_norm() reports the norm.
  float clip_grad_norm = 0.0f;
  // Gradient checkpointing: checkpoints picked by auto_checkpoint (kiln/graph.h,
  // about sqrt(layers) segments) before the backward pass is built, so the
  // planned memory holds one segment's activations at a time and the backward
  // pass recomputes the rest. Tensors marked by hand (kiln::checkpoint,
  // nn::Module::set_checkpoint) are honoured with or without this option.
  bool checkpointing = false;
  // AdamW as multi-tensor steps (issue 44): the gradients and the moments are
  // flat buffers (each param's a slice), zeroed with one fill; the step is one
  // ADAMW_STEP_MULTI node per buffer of params (kMaxAdamWSegments params each),
  // every group's hyper-parameters one [groups, 8] tensor written once a step,
  // and clipping's norm one reduction over the flat gradients. The same
  // arithmetic per element; the norm sums in another order. false: one
  // ADAMW_STEP (and one norm term) per param, as before. SGD is per param.
  bool multi_tensor = true;
  OptimizerType optimizer = OptimizerType::adamw;
  // Empty: schedule::constant() (default parameters). SGD keeps a momentum buffer
  // when the schedule's parameters for step 0 have momentum != 0.
  ScheduleFn schedule;
  // Samples per optimizer step; a multiple of the physical batch B (0: B).
  // Gradients of logical/B physical batches are summed and scaled by B/logical,
  // so a step equals one step on the whole logical batch.
  int64_t logical_batch = 0;
  // Where to run: empty = a CpuBackend of the context's own with n_threads; one
  // backend = that backend (it must support every op); several = a Scheduler over
  // them, in order of preference. Backends must outlive the context.
  std::vector<Backend*> backends;
  int n_threads = 0;  // for the own CpuBackend; <= 0: one per hardware thread
  // Evaluation only: no backward pass, no gradients or optimizer state (less
  // memory); train_batch() and optimizer_step() throw.
  bool forward_only = false;
  // Graph passes run on the program once it is built (kiln/graph_passes.h has
  // the table: what each one changes). Unset: GraphPasses::defaults() for the
  // context's kind (training, or inference when forward_only): every pass valid
  // for it. Set: exactly these; a pass not valid for the kind (e.g.
  // bf16_grad_sums with forward_only) or missing one it needs is a kiln::Error.
  // Either way only the passes the backend supports run (Backend::supports_pass),
  // and none with several backends. OptContext::graph_passes() tells which ran.
  std::optional<GraphPasses> passes;
  // Data-parallel training across processes (see ParallelHook; kiln/dist.h's
  // DataParallel). Null: this process alone. It must outlive the context.
  ParallelHook* parallel = nullptr;
};

// A param's optimizer state: AdamW's moments `m` and `v` (PyTorch's exp_avg and
// exp_avg_sq; saved as "<param>.opt.m" / "<param>.opt.v") or SGD's momentum
// buffer `buf` (momentum_buffer; "<param>.opt.buf"). What the optimizer does not
// keep is undefined.
struct OptimizerState {
  Tensor m, v;
  Tensor buf;
};

// The context is three parts (src/opt): the loss and metrics, the step program
// (forward, backward and optimizer nodes) and the runner (backends, memory).
class OptContext {
 public:
  // Builds the loss, the forward, backward and optimizer graphs and allocates
  // them: params, inputs, labels, gradients and optimizer state get memory in
  // one static buffer (tensors that already have memory keep it), the graphs'
  // intermediates in one planned buffer. Throws kiln::Error "[opt] ..." for
  // inconsistent configurations. The tensors' Context must outlive this.
  explicit OptContext(OptConfig cfg);
  ~OptContext();
  OptContext(const OptContext&) = delete;
  OptContext& operator=(const OptContext&) = delete;

  Tensor inputs() const;
  Tensor labels() const;
  Tensor outputs() const;
  Tensor loss() const;
  Tensor n_correct() const;  // i32 scalar (cross-entropy only)
  const std::vector<Tensor>& params() const;
  Tensor grad(Tensor param) const;  // the gradient accumulator
  // The total L2 norm of the gradients of the latest optimizer step, before
  // clipping (as clip_grad_norm_ returns it); NaN without clip_grad_norm or
  // before the first step.
  double grad_norm() const;
  // A param's optimizer state (all undefined for a tensor that is not a param).
  OptimizerState state(Tensor param) const;

  int64_t physical_batch() const;
  int64_t logical_batch() const;
  int64_t accumulation_steps() const;  // logical / physical
  int64_t step() const;                // optimizer steps taken
  int64_t epoch() const;               // epochs completed (fit advances it)
  void set_schedule(ScheduleFn fn);
  const OptimizerParams& last_params() const;  // of the latest optimizer step

  // ---- per physical batch (inputs and labels written by the caller) ----
  // Forward + backward, gradients accumulated; every accumulation_steps()-th call
  // also steps the optimizer and zeroes the gradients. Adds the batch's loss and
  // accuracy to *r. Returns the batch loss. Throws kiln::Error "[fit] loss is NaN
  // at step N" when the loss is not finite (nothing is stepped then).
  double train_batch(Result* r = nullptr);
  // Forward only (evaluation); the gradients are untouched. `samples` < B: only
  // the first `samples` rows are real (a partial last batch, see
  // Dataset::get_batch): loss and accuracy over them come from the graph, which
  // masks the padding rows out (cross-entropy and mse; a user loss cannot be
  // split and throws). Throws kiln::Error "[evaluate] loss is NaN ..." when the
  // loss is not finite.
  double eval_batch(Result* r = nullptr, int64_t samples = 0);

  // ---- lower level ----
  void forward();           // forward graph only
  void forward_backward();  // accumulates into the gradients
  void optimizer_step();    // one step from the accumulated gradients, then reset_grads()
  void reset_grads();
  // Physical batches accumulated since the last optimizer step.
  int64_t pending_batches() const;

  Backend& backend();  // the (first) backend
  // The backend that runs node t of graph() (the scheduler's choice with several
  // backends), or null when t is not part of it.
  Backend* backend_of(const TensorNode* t) const;
  const MemoryPlan& memory_plan() const;  // of the planned graph buffer
  size_t static_bytes() const;            // params, gradients, optimizer state, inputs
  const Graph& graph() const;             // forward + backward + optimizer nodes
  GraphPasses graph_passes() const;       // the passes run on graph()
  size_t n_forward_nodes() const;
  size_t n_backward_nodes() const;  // forward + backward

  // ---- checkpoints (GGUF through kiln/io.h: atomic write, validated read) ----
  // Params under their names; with optimizer state also "<name>.opt.m" /
  // "<name>.opt.v" (AdamW) or "<name>.opt.buf" (SGD) and the metadata keys
  // kiln.opt.optimizer, kiln.opt.step, kiln.opt.epoch. Params need unique names.
  // `extra` metadata is written too (e.g. the model kind). With a ParallelHook
  // only rank 0 writes, and every rank returns once the file is complete (a
  // failure on rank 0 throws on every rank).
  void save(const std::string& path, bool with_optimizer_state = true,
            const std::vector<std::pair<std::string, GgufValue>>& extra = {}) const;
  // Loads params (and the optimizer state and counters when the file has them and
  // `with_optimizer_state`). All or nothing: every name, dtype and shape of the
  // whole checkpoint (and its optimizer kind and counters) is checked before
  // any byte is written, so a mismatched or corrupt file throws kiln::Error and
  // leaves params, optimizer state and counters exactly as they were. Shapes
  // must be equal (leading dims of size 1 aside, GgufFile::load's rule); an
  // equal element count is not enough. Gradients are reset. Returns the opened file for extra
  // metadata. Any number of ranks may load one file (it holds nothing per rank).
  GgufFile load(const std::string& path, bool with_optimizer_state = true);

 private:
  struct Impl;
  friend struct OptContextInternals;  // src/opt: fit, checkpoints, tests
  std::unique_ptr<Impl> impl_;
};

// ---------------------------------------------------------------------------
// Epochs and fit.
struct BatchInfo {
  int64_t epoch = 0;
  int64_t batch = 0;               // physical batch index within the phase (0-based)
  int64_t n_batches = 0;           // physical batches of the phase
  bool train = true;               // false: validation
  double loss = 0;                 // this batch's loss
  const Result* result = nullptr;  // running result of the phase
  double elapsed_s = 0;            // since the phase began
};

struct EpochResult {
  int64_t epoch = 0;  // 0-based
  Result train, val;
  double seconds = 0;
};

struct FitOptions {
  int64_t epochs = 1;    // train until OptContext::epoch() reaches this
  double val_split = 0;  // fraction of the data (its end) held out for validation
  bool shuffle = true;   // training part, per epoch, with seed + epoch
  uint64_t seed = 42;
  // Progress bar on stderr (<= 80 columns; plain lines when stderr is not a terminal).
  bool progress = true;
  std::function<void(const BatchInfo&)> on_batch;
  // After each epoch; return false to stop training.
  std::function<bool(const EpochResult&)> on_epoch;
};

// One pass over `train` (training; a remainder smaller than a logical batch is
// skipped) and then `val` (forward only; may be empty). Labels come from the
// dataset. Advances opt.epoch() by one.
EpochResult epoch(OptContext& opt, Dataset& data, SampleRange train, SampleRange val,
                  const FitOptions& o = {});
// Epochs from opt.epoch() to o.epochs. Per epoch the training part is put into
// the order given by (seed, epoch) alone, so a resumed run sees the same batches
// as an uninterrupted one. Returns one result per epoch run.
std::vector<EpochResult> fit(OptContext& opt, Dataset& data, const FitOptions& o = {});
// Forward-only pass over `range`, the partial last batch included (except with a
// user loss, which cannot be split per sample). An empty range, or nothing
// evaluated, is a kiln::Error; so is a NaN or infinite loss (see eval_batch).
Result evaluate(OptContext& opt, const Dataset& data, SampleRange range, bool progress = false);

// ---------------------------------------------------------------------------
// Progress output on stderr (used by fit; usable on its own). In a terminal a
// bar is redrawn in place ('\r'); otherwise fit prints one plain line per epoch
// (epoch_line) and the bar draws nothing. No line exceeds 80 columns.
class ProgressBar {
 public:
  // `total`: samples of the phase. `tty`: draw (default: stderr is a terminal).
  ProgressBar(std::string label, int64_t total, bool tty = stderr_is_tty());
  static bool stderr_is_tty();
  void update(int64_t done, const Result& r);  // redraws at most every 100 ms
  void finish(int64_t done, const Result& r);  // final state and a newline
  // The bar's text for `done` samples after `elapsed_s` (at most `width` columns):
  // "train [=====>    ] 28500/57000 loss 0.0119+-0.0004 acc 99.86+-0.02% 0:03 eta 0:03"
  std::string line(int64_t done, const Result& r, double elapsed_s, int width = 79) const;

 private:
  std::string label_;
  int64_t total_;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_;
};
// "0:05", "12:34", "1:02:03".
std::string format_duration(double seconds);
// "loss 0.0652+-0.0120 acc 97.80+-0.27%" (the accuracy part only when there is
// one; an uncertainty only from two batches on).
std::string format_result(const Result& r);
// One epoch as a plain line (at most 80 columns):
// "[ 3/30] train 0.0119+-0.0004 99.86+-0.02% val 0.0652+-0.0120 97.80+-0.27% 3.2s"
std::string epoch_line(const EpochResult& e, int64_t epochs);

}  // namespace kiln
