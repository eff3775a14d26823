// train_on_tokens and TokenLossEvaluator: the iteration loop of language-model
// training on token windows (kiln/token_train.h).
#include "kiln/token_train.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "kiln/ops.h"
#include "opt/seconds_since.h"

namespace kiln {

namespace {
// The mean next-token loss of logits [.., V] against targets; masked: over the
// targets that are not kIgnoreIndex.
Tensor next_token_loss(Tensor logits, Tensor targets, bool masked) {
  const int64_t N = targets.numel(), V = logits.size(logits.ndim() - 1);
  CrossEntropyOptions o;
  if (masked) o.ignore_index = kIgnoreIndex;
  return cross_entropy(logits.reshape({N, V}), targets.reshape({N}), o);
}
}  // namespace

OptConfig next_token_opt_config(const nn::Module& model, Tensor ids, Tensor logits, Tensor targets,
                                float weight_decay, bool masked_labels) {
  OptConfig oc;
  oc.inputs = ids;
  oc.outputs = logits;
  oc.labels = targets;
  oc.loss = LossKind::user;
  oc.user_loss = next_token_loss(logits, targets, masked_labels);
  oc.groups = weight_decay_groups(model, weight_decay);
  oc.model = &model;
  return oc;
}

namespace {}  // namespace

TokenLossEvaluator::TokenLossEvaluator(nn::Module& model, int64_t batch, int64_t block,
                                       Backend& backend)
    : TokenLossEvaluator(model, batch, block, std::vector<Backend*>{&backend}) {}

TokenLossEvaluator::TokenLossEvaluator(nn::Module& model, int64_t batch, int64_t block,
                                       std::vector<Backend*> backends,
                                       std::optional<GraphPasses> passes, bool masked_labels)
    : batch_(batch), block_(block) {
  if (batch < 1 || block < 1)
    fail("TokenLossEvaluator", "batch ", batch, " and block ", block, " must be >= 1");
  Context& ctx = model.ctx();
  const bool was_training = model.training();
  model.eval();
  Tensor ids = ctx.input(i32, {batch, block}, "val_ids");
  Tensor targets = ctx.input(i32, {batch, block}, "val_targets");
  Tensor logits = model(ids);
  if (logits.ndim() != 3 || logits.size(0) != batch || logits.size(1) != block)
    fail("TokenLossEvaluator", "the model's output is ", logits.shape().str(), ", not [", batch,
         ", ", block, ", vocab]");
  OptConfig oc;
  oc.inputs = ids;
  oc.outputs = logits;
  oc.labels = targets;
  oc.loss = LossKind::user;
  oc.user_loss = next_token_loss(logits, targets, masked_labels);
  oc.model = &model;
  oc.forward_only = true;
  oc.backends = std::move(backends);
  oc.passes = passes;
  opt_ = std::make_unique<OptContext>(oc);
  model.train(was_training);
}

TokenLossEvaluator::~TokenLossEvaluator() = default;

void TokenLossEvaluator::check_windows(const TokenDataset& data, int64_t windows) const {
  const int64_t available = data.n_batches(batch_, block_);
  if (windows < batch_ || windows % batch_ != 0 || windows / batch_ > available)
    fail("TokenLossEvaluator", "eval windows ", windows, ": need a multiple of ", batch_, " up to ",
         available * batch_, " (the validation data's full batches of ", batch_, " windows of ",
         block_ + 1, " tokens)");
}

double TokenLossEvaluator::loss(const TokenDataset& data, int64_t windows) {
  check_windows(data, windows);
  double sum = 0;
  const int64_t n = windows / batch_;
  for (int64_t b = 0; b < n; ++b) {
    data.get_batch(opt_->inputs(), opt_->labels(), b);
    sum += opt_->eval_batch();
  }
  return sum / double(n);
}

Tensor TokenLossEvaluator::inputs() const { return opt_->inputs(); }
Tensor TokenLossEvaluator::labels() const { return opt_->labels(); }
double TokenLossEvaluator::batch_loss() { return opt_->eval_batch(); }

TokenTrainResult train_on_tokens(OptContext& opt, TokenLossEvaluator& eval,
                                 const TokenDataset& train, const TokenDataset& val,
                                 const TokenTrainOptions& o) {
  eval.check_windows(val, o.eval_windows);  // before any training
  // The windows of iteration `it` depend only on (seed, it): a resumed run
  // trains on exactly the batches the uninterrupted one would have. The K
  // physical batches draw in turn, so they are the windows of one batch of K*B.
  std::mt19937_64 rng;
  auto write = [&](int64_t it, int64_t k, Tensor inputs, Tensor labels) {
    if (k == 0) rng.seed(o.seed * 0x9E3779B97F4A7C15ull + uint64_t(it));
    train.sample_batch(inputs, labels, rng);
  };
  return train_on_batches(
      opt, write, [&] { return eval.loss(val, o.eval_windows); }, o);
}

TokenTrainResult train_on_batches(OptContext& opt, const BatchWriter& write_batch,
                                  const std::function<double()>& val_loss,
                                  const TokenTrainOptions& o) {
  if (o.eval_interval < 1) fail("train_on_tokens", "eval interval ", o.eval_interval, " < 1");
  if (o.resume) {
    if (o.checkpoint.empty()) fail("train_on_tokens", "resume needs a checkpoint path");
    opt.load(o.checkpoint);  // params, optimizer state and the step counter
    if (o.progress)
      std::fprintf(stderr, "resumed %s at iteration %lld\n", o.checkpoint.c_str(),
                   (long long)opt.step());
  }
  if (opt.pending_batches() != 0)
    fail("train_on_tokens", opt.pending_batches(),
         " physical batches are accumulated but not stepped: an iteration must start a step");
  // One iteration is one optimizer step: K physical batches of [B, T].
  const int64_t B = opt.inputs().size(0), T = opt.inputs().size(1), K = opt.accumulation_steps();
  const bool tty = o.progress && ProgressBar::stderr_is_tty();
  TokenTrainResult r;
  r.first_iter = opt.step();
  r.end_iter = o.stop_after > 0 ? std::min(o.iters, r.first_iter + o.stop_after) : o.iters;
  const auto t0 = detail::SteadyClock::now();
  auto t_rate = t0;  // tokens/s are counted from the 10th iteration on
  int64_t rate_start = -1;
  double interval_loss = 0;
  int64_t interval_n = 0;
  double last_val = NAN;
  for (int64_t it = r.first_iter; it < r.end_iter; ++it) {
    if (it - r.first_iter == 10) t_rate = detail::SteadyClock::now(), rate_start = it;
    double loss = 0;
    for (int64_t k = 0; k < K; ++k) {
      write_batch(it, k, opt.inputs(), opt.labels());
      loss += opt.train_batch();
    }
    interval_loss += loss / double(K);
    ++interval_n;
    if (tty) {
      const double rate = rate_start < 0 ? 0.0
                                         : double((it + 1 - rate_start) * K * B * T) /
                                               detail::seconds_since(t_rate);
      std::fprintf(stderr, "\r%s iter %lld/%lld loss %.4f %.1fk tok/s %s   ", o.label.c_str(),
                   (long long)(it + 1), (long long)o.iters, interval_loss / double(interval_n),
                   rate / 1000, format_duration(detail::seconds_since(t0)).c_str());
    }
    if ((it + 1) % o.eval_interval == 0 || it + 1 == r.end_iter) {
      last_val = val_loss();
      TokenTrainEval e{it + 1, interval_loss / double(interval_n), last_val, opt.last_params().lr(),
                       detail::seconds_since(t0)};
      if (o.progress)
        std::fprintf(stderr, "%siter %lld: train_loss %.4f val_loss %.4f lr %.2e\n",
                     tty ? "\n" : "", (long long)e.iter, e.train_loss, e.val_loss, e.lr);
      interval_loss = 0, interval_n = 0;
      // Atomic: a crash keeps the previous checkpoint.
      if (!o.checkpoint.empty()) opt.save(o.checkpoint, true, o.checkpoint_metadata);
      r.evals.push_back(e);
      if (o.on_eval) o.on_eval(e);
    }
  }
  r.train_time_s = detail::seconds_since(t0);
  // A run too short to leave its first 10 iterations out is timed whole.
  const int64_t timed_from = rate_start < 0 ? r.first_iter : rate_start;
  const double timed_s = detail::seconds_since(rate_start < 0 ? t0 : t_rate);
  r.tokens_per_s = timed_s > 0 ? double((r.end_iter - timed_from) * K * B * T) / timed_s : 0.0;
  r.val_loss = std::isnan(last_val) ? val_loss() : last_val;
  return r;
}

}  // namespace kiln
