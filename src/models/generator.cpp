// Generator: KV-cache graphs per shape, prefill in passes, the decode loop.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/generate.h"
#include "models/kv_attention.h"

namespace kiln::models {

// One forward pass of `tokens` new tokens over `cached` cache rows: its inputs,
// outputs and memory, built on first use and run again for every pass of that shape.
struct Generator::StepGraph {
  KvStep step;
  Tensor logits;  // [1, vocab]
  Graph graph;
  std::unique_ptr<GraphAllocator> alloc;
  std::vector<float> mask;
  std::vector<int32_t> ids, positions;
};

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Copies `rows` leading rows of src (contiguous) to rows [at, at + rows) of dst
// (contiguous, the same row size), through the buffers' own accessors.
void copy_rows(const TensorNode* src, TensorNode* dst, int64_t at, int64_t rows) {
  const size_t row = dst->nbytes() / size_t(dst->shape[0]);
  const size_t n = row * size_t(rows), off = row * size_t(at);
  if (src->buffer->is_host() && dst->buffer->is_host()) {
    std::memcpy(static_cast<char*>(dst->data) + off, src->data, n);
    return;
  }
  std::vector<char> tmp(n);
  src->buffer->get(src, tmp.data(), 0, n);
  dst->buffer->set(dst, tmp.data(), off, n);
}
}  // namespace

Generator::Generator(CausalLM& model, Backend& backend, const GeneratorOptions& opt)
    : model_(model), backend_(backend), opt_(opt), kv_(model.kv_layout()) {
  if (opt_.prefill_chunk < 1)
    fail("generate", "prefill_chunk must be at least 1, got ", opt_.prefill_chunk);
  check_graph_passes("generate", opt_.passes, GraphKind::inference);
  passes_ = backend_.supported_passes(opt_.passes);
  capacity_ = opt_.max_seq_len > 0 ? opt_.max_seq_len : model.max_seq_len();
  if (capacity_ > model.max_seq_len())
    fail("generate", "max_seq_len ", capacity_, " is more than the ", model.max_seq_len(),
         " positions the model takes (", model.type_name(), "::max_seq_len)");
  model_.eval();
  Context& ctx = model_.ctx();
  for (int64_t l = 0; l < kv_.layers; ++l) {
    // [positions, kv heads, 1, head dim]: rows of a position contiguous (one copy
    // appends them); the unit dim lets attention view them as [heads, 1, rows, dim].
    const Shape s{capacity_, kv_.kv_heads, 1, kv_.head_dim};
    k_cache_.push_back(ctx.tensor(f32, s, "kv.k." + std::to_string(l)));
    v_cache_.push_back(ctx.tensor(f32, s, "kv.v." + std::to_string(l)));
  }
  cache_buf_ = detail::place_zeroed_caches(backend_.buffer_type(), k_cache_, v_cache_);
}

Generator::~Generator() = default;

int64_t Generator::cache_bucket(int64_t pos) const {
  return detail::kv_cache_bucket(pos, capacity_);
}

Generator::StepGraph& Generator::graph_for(int64_t tokens, int64_t cached) {
  std::unique_ptr<StepGraph>& slot = graphs_[{tokens, cached}];
  if (slot) return *slot;
  auto g = std::make_unique<StepGraph>();
  Context& ctx = model_.ctx();
  KvStep& s = g->step;
  s.ids = ctx.input(i32, {1, tokens}, "gen.ids");
  s.positions = ctx.input(i32, {tokens}, "gen.positions");
  s.mask = ctx.input(f32, {tokens, cached + tokens}, "gen.mask");
  s.last = ctx.input(i32, {1}, "gen.last");
  s.cached = cached;
  s.k_cache = k_cache_;
  s.v_cache = v_cache_;
  g->logits = detail::build_cached_forward(model_, s, kv_.layers, passes_, g->graph);
  g->alloc = std::make_unique<GraphAllocator>(backend_.buffer_type());
  g->alloc->alloc(g->graph);
  g->mask.resize(size_t(tokens * (cached + tokens)));
  g->ids.resize(size_t(tokens));
  g->positions.resize(size_t(tokens));
  slot = std::move(g);
  return *slot;
}

std::span<const float> Generator::prefill(std::span<const int32_t> ids) {
  const int64_t n = int64_t(ids.size()), V = model_.vocab_size();
  if (n == 0) fail("generate", "no tokens to run (an empty prompt)");
  for (int64_t i = 0; i < n; ++i)
    if (ids[size_t(i)] < 0 || ids[size_t(i)] >= V)
      fail("generate", "token id ", ids[size_t(i)], " (at index ", i,
           ") is outside the model's vocabulary of ", V, " ids");
  if (pos_ + n > capacity_)
    fail("generate", pos_, " cached + ", n, " new tokens do not fit the cache of ", capacity_,
         " positions (GeneratorOptions::max_seq_len; the model takes ", model_.max_seq_len(), ")");
  const int64_t window = model_.config().llama ? model_.config().llama->sliding_window : int64_t(0);
  const float ninf = -std::numeric_limits<float>::infinity();
  StepGraph* g = nullptr;
  for (int64_t done = 0; done < n;) {
    const int64_t T = detail::prefill_pass_tokens(n - done, opt_.prefill_chunk),
                  real = std::min(T, n - done);
    const int64_t L = pos_ == 0 ? 0 : cache_bucket(pos_);
    g = &graph_for(T, L);
    for (int64_t t = 0; t < T; ++t) {
      g->ids[size_t(t)] = t < real ? ids[size_t(done + t)] : 0;
      g->positions[size_t(t)] = int32_t(std::min(pos_ + t, capacity_ - 1));
      // Cache row j holds position j: visible below pos_ (and inside the window);
      // new token s is visible to new token t when s <= t (and inside the window).
      float* row = g->mask.data() + t * (L + T);
      for (int64_t j = 0; j < L; ++j)
        row[j] = j < pos_ && (window == 0 || pos_ + t - j < window) ? 0.0f : ninf;
      for (int64_t s = 0; s < T; ++s)
        row[L + s] = s <= t && (window == 0 || t - s < window) ? 0.0f : ninf;
    }
    g->step.ids.set<int32_t>(g->ids);
    g->step.positions.set<int32_t>(g->positions);
    g->step.mask.set<float>(g->mask);
    g->step.last.set<int32_t>({int32_t(real - 1)});
    backend_.compute(g->graph);
    for (size_t l = 0; l < size_t(kv_.layers); ++l) {
      copy_rows(g->step.k_new[l].node(), k_cache_[l].node(), pos_, real);
      copy_rows(g->step.v_new[l].node(), v_cache_[l].node(), pos_, real);
    }
    cached_.insert(cached_.end(), ids.begin() + done, ids.begin() + done + real);
    pos_ += real;
    done += real;
  }
  const TensorNode* out = g->logits.node();
  logits_.resize(size_t(V));
  out->buffer->get(out, logits_.data(), 0, logits_.size() * sizeof(float));
  return logits_;
}

int64_t Generator::prefill_uncached(std::span<const int32_t> ids) {
  size_t keep = 0;
  const size_t most = std::min(cached_.size(), ids.size());
  while (keep < most && cached_[keep] == ids[keep]) ++keep;
  truncate(int64_t(keep));
  if (keep < ids.size()) prefill(ids.subspan(keep));
  return int64_t(ids.size() - keep);
}

void Generator::truncate(int64_t n) {
  if (n < 0 || n > pos_) fail("generate", "truncate to ", n, " tokens, but the cache holds ", pos_);
  pos_ = n;
  cached_.resize(size_t(n));
}

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::max_tokens: return "max_tokens";
    case StopReason::eos: return "eos";
    case StopReason::context_full: return "context_full";
    case StopReason::callback: return "callback";
  }
  return "?";
}

GenerationResult Generator::generate(std::span<const int32_t> prompt, const GenerateOptions& opt,
                                     const TokenCallback& on_token) {
  if (opt.max_new_tokens < 0)
    fail("generate", "max_new_tokens must be >= 0, got ", opt.max_new_tokens);
  const std::vector<int64_t>& eos =
      opt.eos_token_ids.empty() ? model_.config().generation.eos_token_ids : opt.eos_token_ids;
  GenerationResult r;
  Sampler sampler(opt.sampling);
  sampler.set_prompt(prompt);
  size_t reuse = 0;
  if (opt.reuse_cache && !prompt.empty()) {  // the last prompt token always runs: its logits
    const size_t most = std::min(cached_.size(), prompt.size() - 1);
    while (reuse < most && cached_[reuse] == prompt[reuse]) ++reuse;
  }
  truncate(int64_t(reuse));
  auto t0 = Clock::now();
  std::span<const float> logits = prefill(prompt.subspan(reuse));
  r.stats.prompt_tokens = int64_t(prompt.size() - reuse);
  r.stats.reused_tokens = int64_t(reuse);
  r.stats.prompt_seconds = seconds_since(t0);
  t0 = Clock::now();
  while (int64_t(r.ids.size()) < opt.max_new_tokens) {
    const int32_t id = sampler.sample(logits);
    r.ids.push_back(id);
    if (on_token && !on_token(id)) {
      r.stop = StopReason::callback;
      break;
    }
    if (!opt.ignore_eos && std::find(eos.begin(), eos.end(), int64_t(id)) != eos.end()) {
      r.stop = StopReason::eos;
      break;
    }
    if (int64_t(r.ids.size()) == opt.max_new_tokens) break;
    if (pos_ == capacity_) {
      r.stop = StopReason::context_full;
      break;
    }
    logits = step(id);
    ++r.stats.decode_steps;
  }
  r.stats.decode_seconds = seconds_since(t0);
  r.stats.new_tokens = int64_t(r.ids.size());
  return r;
}

SamplingConfig default_sampling(const GenerationConfig& g, SamplingConfig fallback) {
  SamplingConfig c = std::move(fallback);
  if (g.temperature) c.temperature = *g.temperature;
  if (g.top_k) c.top_k = *g.top_k;
  if (g.top_p) c.top_p = *g.top_p;
  if (g.min_p) c.min_p = *g.min_p;
  if (g.repetition_penalty) c.repetition_penalty = *g.repetition_penalty;
  if (g.do_sample && !*g.do_sample) c.temperature = 0;
  return c;
}

}  // namespace kiln::models
