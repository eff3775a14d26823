// Training a language model on token windows by iterations (nanoGPT's loop),
// shared by kiln-gpt and kiln-lm pretrain:
//
//   kiln::OptContext opt(cfg);  // next-token loss over [B, T] windows (labels [B, T])
//   kiln::TokenLossEvaluator eval(model, /*batch*/ 8, T, cpu);  // forward only, eval mode
//   kiln::TokenTrainOptions o;
//   o.iters = 2000, o.eval_interval = 250, o.checkpoint = "out/gpt.gguf";
//   kiln::TokenTrainResult r = kiln::train_on_tokens(opt, eval, train, val, o);
//
// Iteration `it` trains on windows drawn from a generator seeded by (seed, it)
// alone, and every evaluation writes a checkpoint (weights, AdamW state, step),
// so a run stopped (stop_after) and resumed (resume) trains on exactly the
// batches of an uninterrupted one and ends with the same weights.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/opt.h"
#include "kiln/token_dataset.h"

namespace kiln {

// The mean next-token cross-entropy of a model over consecutive validation
// windows: a forward-only graph of model(ids [batch, block]) -> logits
// [batch, block, vocab], built in eval mode (no dropout) over the model's weights.
// The model's mode is left as it was.
class TokenLossEvaluator {
 public:
  TokenLossEvaluator(nn::Module& model, int64_t batch, int64_t block, Backend& backend);
  // Several backends, as OptConfig::backends (the first preferred; e.g. CUDA with
  // the CPU for what it lacks). `passes`: OptConfig::passes of its forward-only
  // context (unset: the inference defaults).
  TokenLossEvaluator(nn::Module& model, int64_t batch, int64_t block,
                     std::vector<Backend*> backends, std::optional<GraphPasses> passes = {},
                     bool masked_labels = false);
  ~TokenLossEvaluator();
  // Mean loss over the first `windows` windows of `data` (TokenDataset::get_batch
  // order). `windows` must be a positive multiple of batch() that `data` holds.
  double loss(const TokenDataset& data, int64_t windows);
  // Throws what loss() would for these windows, without computing.
  void check_windows(const TokenDataset& data, int64_t windows) const;
  // One batch the caller wrote into inputs() and labels() (chat data): its mean
  // loss over the labels that count (masked_labels: kIgnoreIndex labels do not).
  Tensor inputs() const;
  Tensor labels() const;
  double batch_loss();
  int64_t batch() const { return batch_; }
  int64_t block() const { return block_; }

 private:
  std::unique_ptr<OptContext> opt_;
  int64_t batch_, block_;
};

// One evaluation of a run.
struct TokenTrainEval {
  int64_t iter = 0;       // iterations done
  double train_loss = 0;  // mean training loss since the previous evaluation
  double val_loss = 0;
  double lr = 0;       // of the latest optimizer step
  double seconds = 0;  // since this call began
};

struct TokenTrainOptions {
  int64_t iters = 2000;         // the run's last iteration (as the schedule's end)
  int64_t stop_after = 0;       // iterations in this call; 0: up to iters
  int64_t eval_interval = 250;  // iterations between evaluations (and checkpoints)
  int64_t eval_windows = 200;   // validation windows per evaluation
  uint64_t seed = 1337;         // of the training windows
  std::string checkpoint;       // OptContext::save at every evaluation; empty: none
  std::vector<std::pair<std::string, GgufValue>> checkpoint_metadata;
  bool resume = false;   // first OptContext::load(checkpoint): weights, optimizer state, step
  bool progress = true;  // one line per evaluation on stderr (and a live line in a terminal)
  std::string label = "train";  // starts the progress lines
  // After each evaluation and its checkpoint (curves, exports).
  std::function<void(const TokenTrainEval&)> on_eval;
};

struct TokenTrainResult {
  int64_t first_iter = 0, end_iter = 0;  // this call trained iterations [first, end)
  double val_loss = 0;                   // at end_iter
  // Training tokens per second from this call's 10th iteration on (over the
  // whole call when it ran 10 or fewer), and the seconds of the whole call.
  double tokens_per_s = 0;
  double train_time_s = 0;
  std::vector<TokenTrainEval> evals;  // of this call
};

// The OptConfig of next-token training, what kiln-gpt, kiln-lm pretrain and
// finetune share: inputs i32 `ids` [B, T], outputs `logits` [B, T, V] of `model`,
// labels i32 `targets` [B, T], the loss the mean cross-entropy of every position
// (LossKind::user), `weight_decay` on matrices only (weight_decay_groups) and the
// model's trainable params (OptConfig::model). The caller sets the schedule,
// clipping and backends.
// masked_labels: targets equal to kIgnoreIndex (kiln/ops.h) get no loss, and the
// loss is the mean over the others (chat data: only the assistant's tokens).
OptConfig next_token_opt_config(const nn::Module& model, Tensor ids, Tensor logits, Tensor targets,
                                float weight_decay, bool masked_labels = false);

// Trains `opt` (inputs and labels [B, T] i32) on random windows of `train`
// from opt.step() (after resuming) to options.iters, evaluating on `val` with
// `eval`. An iteration is one optimizer step: opt.accumulation_steps() physical
// batches (OptConfig::logical_batch, gradient accumulation) whose windows are
// those one batch of logical_batch would draw. kiln::Error for options that
// do not fit (eval windows, a missing checkpoint path for resume).
TokenTrainResult train_on_tokens(OptContext& opt, TokenLossEvaluator& eval,
                                 const TokenDataset& train, const TokenDataset& val,
                                 const TokenTrainOptions& options);

// The same loop over batches the caller makes: write_batch(step, k, inputs,
// labels) writes physical batch k of optimizer step `step` (it must depend on
// step and k alone for an exact resume); val_loss() is the validation loss at
// each evaluation. TokenTrainOptions::seed and eval_windows are the caller's.
using BatchWriter = std::function<void(int64_t step, int64_t k, Tensor inputs, Tensor labels)>;
TokenTrainResult train_on_batches(OptContext& opt, const BatchWriter& write_batch,
                                  const std::function<double()>& val_loss,
                                  const TokenTrainOptions& options);

}  // namespace kiln
