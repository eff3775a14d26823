// Checkpoints of an OptContext: params, optimizer state and counters in one GGUF
// file (kiln/io.h writes atomically and validates on reading).
#include <array>
#include <unordered_set>
#include <utility>

#include "opt/opt_context_impl.h"

namespace kiln {

namespace {

constexpr const char* kKeyOptimizer = "kiln.opt.optimizer";
constexpr const char* kKeyStep = "kiln.opt.step";
constexpr const char* kKeyEpoch = "kiln.opt.epoch";

// The optimizer state's tensors and their names' suffixes in a checkpoint (the
// on-disk names kiln has always used).
std::array<std::pair<Tensor, const char*>, 3> state_files(const OptimizerState& st) {
  return {{{st.m, ".opt.m"}, {st.v, ".opt.v"}, {st.buf, ".opt.buf"}}};
}

void check_names(const std::vector<Tensor>& params) {
  std::unordered_set<std::string> seen;
  for (const Tensor& p : params) {
    if (p.name().empty())
      fail("checkpoint", "param ", p.shape().str(),
           " has no name: name every param (Tensor::set_name) to save it");
    if (!seen.insert(p.name()).second) fail("checkpoint", "two params are named '", p.name(), "'");
  }
}

// The file's tensor `name` must be loadable into t: the same name, dtype and
// shape (GgufFile::load's rule, not just the element count: a [3, 8] tensor
// saved as [8, 3] is refused here, before anything is written).
void check_fits(const GgufFile& f, Tensor t, const std::string& name) {
  try {
    f.check_load(t, name);
  } catch (const Error& e) {
    fail("checkpoint", "nothing was loaded: ", e.what());
  }
}

}  // namespace

void OptContext::save(const std::string& path, bool with_optimizer_state,
                      const std::vector<std::pair<std::string, GgufValue>>& extra) const {
  const Impl& s = *impl_;
  check_names(s.prog.params);
  with_optimizer_state = with_optimizer_state && !s.cfg.forward_only;
  if (with_optimizer_state && s.pending != 0)
    fail("checkpoint", s.pending,
         " physical batches are accumulated but not stepped yet; save after an ",
         "optimizer step (a whole logical batch)");
  if (s.par && s.par->size() > 1) {
    // Rank 0 writes; the sum of its success flag doubles as the barrier after
    // which every rank may read the file.
    double ok[1] = {0};
    std::string err;
    if (s.par->rank() == 0) {
      try {
        s.write_checkpoint(path, with_optimizer_state, extra);
        ok[0] = 1;
      } catch (const Error& e) {
        err = e.what();
      }
    }
    s.par->sum(ok);
    if (s.par->rank() == 0 && ok[0] == 0) throw Error(err);
    if (ok[0] == 0) fail("checkpoint", "rank 0 could not write ", path);
    return;
  }
  s.write_checkpoint(path, with_optimizer_state, extra);
}

void OptContext::Impl::write_checkpoint(
    const std::string& path, bool with_optimizer_state,
    const std::vector<std::pair<std::string, GgufValue>>& extra) const {
  const Impl& s = *this;
  GgufWriter w;
  for (const auto& [k, v] : extra) w.set(k, v);
  for (const Tensor& p : s.prog.params) w.add_tensor(p, p.name());
  if (with_optimizer_state) {
    w.set(kKeyOptimizer, optimizer_name(s.cfg.optimizer));
    w.set(kKeyStep, int64_t(s.step));
    w.set(kKeyEpoch, int64_t(s.epoch));
    for (size_t i = 0; i < s.prog.params.size(); ++i) {
      const std::string& n = s.prog.params[i].name();
      for (const auto& [t, suffix] : state_files(s.prog.state[i]))
        if (t.defined()) w.add_tensor(t, n + suffix);
    }
  }
  w.save(path);
}

GgufFile OptContext::load(const std::string& path, bool with_optimizer_state) {
  Impl& s = *impl_;
  check_names(s.prog.params);
  GgufFile f(path);  // validates header, metadata and tensor descriptors
  // Check every name, dtype and shape (and the metadata) before changing
  // anything: a bad file leaves params, optimizer state and counters as they
  // were. After these checks only an I/O error (the file truncated in place
  // while loading) can stop the loop below part way.
  for (const Tensor& p : s.prog.params) check_fits(f, p, p.name());
  const bool has_state = with_optimizer_state && !s.cfg.forward_only && f.has(kKeyStep);
  int64_t step = 0, epoch = 0;
  if (has_state) {
    const std::string kind = f.get(kKeyOptimizer).as_string();
    if (kind != optimizer_name(s.cfg.optimizer))
      fail("checkpoint", path, ": the file holds ", kind, " state but this context uses ",
           optimizer_name(s.cfg.optimizer));
    step = f.get(kKeyStep).as_int();
    epoch = f.get(kKeyEpoch).as_int();
    if (step < 0 || epoch < 0)
      fail("checkpoint", path, ": negative step ", step, " or epoch ", epoch);
    for (size_t i = 0; i < s.prog.params.size(); ++i)
      for (const auto& [t, suffix] : state_files(s.prog.state[i]))
        if (t.defined()) check_fits(f, t, s.prog.params[i].name() + suffix);
  }
  for (const Tensor& p : s.prog.params) f.load(p, p.name());
  if (has_state) {
    for (size_t i = 0; i < s.prog.params.size(); ++i)
      for (const auto& [t, suffix] : state_files(s.prog.state[i]))
        if (t.defined()) f.load(t, s.prog.params[i].name() + suffix);
    s.step = step;
    s.epoch = epoch;
    // The dropout seed counts training passes: as many as the saved run had
    // (modulo 2^64: only its low 32 bits seed, and a corrupt step must not overflow).
    s.passes = int64_t(uint64_t(step) * uint64_t(s.k));
  }
  s.zero_grads();
  s.pending = 0;
  s.notified = 0;
  s.synced = false;  // rank 0's values are broadcast again before the next pass
  return f;
}

}  // namespace kiln
