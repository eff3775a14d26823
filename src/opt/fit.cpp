// epoch(), fit() and evaluate(): the training loop over a Dataset.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "kiln/ext/tensor_node.h"
#include "kiln/opt.h"
#include "opt/opt_context_impl.h"
#include "opt/seconds_since.h"

namespace kiln {

namespace {

// Seed of epoch e's order: depends on (seed, e) only, so a resumed run shuffles
// like an uninterrupted one.
uint64_t epoch_seed(uint64_t seed, int64_t e) {
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * uint64_t(e + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void check_dataset(const OptContext& opt, const Dataset& data) {
  if (opt.labels().defined() && !data.has_labels())
    fail("fit", "the model needs labels ", opt.labels().shape().str(), " but the dataset has none");
}

// The context's rank and number of ranks (0 and 1 without a ParallelHook).
int rank(const OptContext& opt) { return OptContextInternals::of(opt).rank(); }
int64_t ranks(const OptContext& opt) { return OptContextInternals::of(opt).world_size(); }

// Data parallelism: the sums in a Result over every rank.
void reduce(const OptContext& opt, Result& r) {
  if (ranks(opt) == 1) return;
  double v[5] = {double(r.n_samples), double(r.n_batches), r.loss_sum, r.loss_sq_sum,
                 double(r.n_correct)};
  OptContextInternals::of(opt).par->sum(v);
  r.n_samples = int64_t(v[0]);
  r.n_batches = int64_t(v[1]);
  r.loss_sum = v[2];
  r.loss_sq_sum = v[3];
  if (r.n_correct >= 0) r.n_correct = int64_t(v[4]);
}

// Runs `n` physical batches of `range` (train or eval) with progress output.
// With N ranks, global batch b of N*B samples is split among them: rank r
// takes its r-th slice of B, so N ranks step exactly like one process with
// batch N*B. The bar (rank 0 only) shows rank 0's running loss until the end
// of the phase, then the result summed over ranks.
Result run_phase(OptContext& opt, const Dataset& data, SampleRange range, int64_t n, bool train,
                 int64_t epoch, const FitOptions& o) {
  Result r;
  const int64_t B = opt.physical_batch(), N = ranks(opt);
  // Evaluation also runs the partial last global batch (a user loss cannot be
  // split per sample: its remainder is left out). Rank k's slice of it holds
  // `mine` real samples, possibly none.
  const int64_t rem =
      train || !OptContextInternals::of(opt).lm.splittable() ? 0 : range.remainder(B * N);
  const int64_t n_all = n + (rem > 0 ? 1 : 0);
  const int64_t total = n * B * N + rem;
  ProgressBar bar(train ? "train" : "val  ", total,
                  o.progress && rank(opt) == 0 && ProgressBar::stderr_is_tty());
  const detail::SteadyClock::time_point t0 = detail::SteadyClock::now();
  for (int64_t b = 0; b < n_all; ++b) {
    const int64_t mine = b < n ? B : std::clamp<int64_t>(rem - rank(opt) * B, 0, B);
    if (mine == 0) continue;
    data.get_batch(opt.inputs(), opt.labels(), b * N + rank(opt), range);
    const double l = train ? opt.train_batch(&r) : opt.eval_batch(&r, mine);
    bar.update(std::min((b + 1) * B * N, total), r);
    if (o.on_batch) o.on_batch(BatchInfo{epoch, b, n_all, train, l, &r, detail::seconds_since(t0)});
  }
  reduce(opt, r);
  if (n_all > 0) bar.finish(total, r);
  return r;
}

}  // namespace

EpochResult epoch(OptContext& opt, Dataset& data, SampleRange train, SampleRange val,
                  const FitOptions& o) {
  check_dataset(opt, data);
  const int64_t B = opt.physical_batch(), N = ranks(opt);
  // Whole logical batches only: a partial one would leave gradients pending.
  const int64_t n_train = train.n_batches(opt.logical_batch() * N) * opt.accumulation_steps();
  if (n_train == 0 && train.size() > 0)
    fail("fit", "the training range has ", train.size(),
         " samples, fewer than one logical batch of ", opt.logical_batch(),
         N > 1 ? " on each of " + std::to_string(N) + " ranks" : "");
  EpochResult e;
  e.epoch = opt.epoch();
  const detail::SteadyClock::time_point t0 = detail::SteadyClock::now();
  e.train = run_phase(opt, data, train, n_train, true, e.epoch, o);
  e.val = run_phase(opt, data, val, val.n_batches(B * N), false, e.epoch, o);
  e.seconds = detail::seconds_since(t0);
  OptContextInternals::of(opt).epoch = e.epoch + 1;
  return e;
}

std::vector<EpochResult> fit(OptContext& opt, Dataset& data, const FitOptions& o) {
  check_dataset(opt, data);
  if (!(o.val_split >= 0 && o.val_split < 1))
    fail("fit", "val_split must be in [0, 1), got ", o.val_split);
  const int64_t global_batch = opt.logical_batch() * ranks(opt);
  auto [train, val] = data.split(o.val_split, global_batch);
  const int64_t steps_per_epoch = train.n_batches(global_batch);
  if (steps_per_epoch == 0)
    fail("fit", "the training part has ", train.size(), " samples (of ", data.size(),
         "), fewer than one logical batch of ", global_batch,
         ranks(opt) > 1 ? " (over all ranks)" : "");
  auto& s = OptContextInternals::of(opt);
  s.steps_per_epoch = steps_per_epoch;  // for the schedule's StepInfo
  s.epochs = o.epochs;
  const bool print = o.progress && rank(opt) == 0;  // one rank speaks for all
  const bool tty = print && ProgressBar::stderr_is_tty();
  std::vector<EpochResult> history;
  for (int64_t ep = opt.epoch(); ep < o.epochs; ++ep) {
    if (o.shuffle) {
      data.reset_order();
      data.shuffle(epoch_seed(o.seed, ep), train);
    }
    if (tty) std::fprintf(stderr, "epoch %lld/%lld\n", (long long)(ep + 1), (long long)o.epochs);
    EpochResult e = epoch(opt, data, train, val, o);
    if (print && !tty) {
      std::fprintf(stderr, "%s\n", epoch_line(e, o.epochs).c_str());
      std::fflush(stderr);
    }
    history.push_back(e);
    if (o.on_epoch && !o.on_epoch(history.back())) break;
  }
  return history;
}

Result evaluate(OptContext& opt, const Dataset& data, SampleRange range, bool progress) {
  check_dataset(opt, data);
  if (range.size() == 0) fail("evaluate", "the range to evaluate is empty");
  FitOptions o;
  o.progress = progress;
  Result r = run_phase(opt, data, range, range.n_batches(opt.physical_batch() * ranks(opt)), false,
                       opt.epoch(), o);
  if (r.n_samples == 0)
    fail("evaluate", "no sample was evaluated: the range has ", range.size(),
         " samples, fewer than one batch of ", opt.physical_batch() * ranks(opt),
         ", and a user loss cannot be evaluated on a partial batch");
  return r;
}

}  // namespace kiln
