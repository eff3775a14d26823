// BatchGenerator: several sequences' caches, prompt passes per sequence and
// one decode pass over all of them (KvStep::batch).
#include <algorithm>
#include <cstring>
#include <limits>
#include <string>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"
#include "kiln/generate.h"
#include "models/kv_attention.h"

namespace kiln::models {

// One forward pass shape: its inputs, outputs and host copies of the inputs.
struct BatchGenerator::PassGraph {
  KvStep step;
  Tensor logits;  // [rows whose logits are returned, vocab]
  Graph graph;
  std::vector<float> mask;
  std::vector<int32_t> ids, positions, last;
};

namespace {

// n bytes from src (at byte src_off) to dst (at byte dst_off), through the
// buffers' own accessors unless both are host memory.
void copy_bytes(const TensorNode* src, size_t src_off, TensorNode* dst, size_t dst_off, size_t n) {
  if (src->buffer->is_host() && dst->buffer->is_host()) {
    std::memmove(static_cast<char*>(dst->data) + dst_off,
                 static_cast<const char*>(src->data) + src_off, n);
    return;
  }
  std::vector<char> tmp(n);
  src->buffer->get(src, tmp.data(), src_off, n);
  dst->buffer->set(dst, tmp.data(), dst_off, n);
}
}  // namespace

BatchGenerator::BatchGenerator(CausalLM& model, Backend& backend, int64_t max_sequences,
                               const GeneratorOptions& opt)
    : model_(model), backend_(backend), opt_(opt), kv_(model.kv_layout()) {
  if (max_sequences < 1) fail("generate", "max_sequences must be at least 1, got ", max_sequences);
  if (opt_.prefill_chunk < 1)
    fail("generate", "prefill_chunk must be at least 1, got ", opt_.prefill_chunk);
  check_graph_passes("generate", opt_.passes, GraphKind::inference);
  passes_ = backend_.supported_passes(opt_.passes);
  max_seqs_ = max_sequences;
  capacity_ = opt_.max_seq_len > 0 ? opt_.max_seq_len : model.max_seq_len();
  if (capacity_ > model.max_seq_len())
    fail("generate", "max_seq_len ", capacity_, " is more than the ", model.max_seq_len(),
         " positions the model takes (", model.type_name(), "::max_seq_len)");
  model_.eval();
  Context& ctx = model_.ctx();
  for (int64_t l = 0; l < kv_.layers; ++l) {
    // [sequence, position, kv heads, head dim]: one position's rows contiguous
    // (one copy appends them), one sequence's positions contiguous.
    const Shape s{max_seqs_, capacity_, kv_.kv_heads, kv_.head_dim};
    k_cache_.push_back(ctx.tensor(f32, s, "kvb.k." + std::to_string(l)));
    v_cache_.push_back(ctx.tensor(f32, s, "kvb.v." + std::to_string(l)));
  }
  cache_buf_ = detail::place_zeroed_caches(backend_.buffer_type(), k_cache_, v_cache_);
  alloc_ = std::make_unique<GraphAllocator>(backend_.buffer_type());
  kept_.resize(size_t(max_seqs_));
}

BatchGenerator::~BatchGenerator() = default;

int64_t BatchGenerator::cache_bucket(int64_t pos) const {
  return detail::kv_cache_bucket(pos, capacity_);
}

size_t BatchGenerator::row_of(int64_t seq, const char* what) const {
  for (size_t r = 0; r < rows_.size(); ++r)
    if (rows_[r].seq == seq) return r;
  fail("generate", what, ": sequence ", seq, " is not active (finished, or never started)");
}

BatchGenerator::PassGraph& BatchGenerator::graph_for(int64_t row, int64_t tokens, int64_t cached) {
  std::unique_ptr<PassGraph>& slot = graphs_[{row, tokens, cached}];
  if (slot) return *slot;
  auto g = std::make_unique<PassGraph>();
  Context& ctx = model_.ctx();
  KvStep& s = g->step;
  const bool decode = row < 0;
  const int64_t outs = decode ? tokens : 1;
  s.ids = ctx.input(i32, {1, tokens}, "batch.ids");
  s.positions = ctx.input(i32, {tokens}, "batch.positions");
  s.mask = decode ? ctx.input(f32, {tokens, 1, 1, cached + 1}, "batch.mask")
                  : ctx.input(f32, {tokens, cached + tokens}, "batch.mask");
  s.last = ctx.input(i32, {outs}, "batch.last");
  s.cached = cached;
  if (decode) {
    s.batch = tokens;
    s.k_cache = k_cache_;
    s.v_cache = v_cache_;
  } else {  // one sequence's cache, in the layout Generator's caches have
    const Shape one{capacity_, kv_.kv_heads, 1, kv_.head_dim};
    for (size_t l = 0; l < k_cache_.size(); ++l) {
      s.k_cache.push_back(k_cache_[l].narrow(0, row, 1).reshape(one));
      s.v_cache.push_back(v_cache_[l].narrow(0, row, 1).reshape(one));
    }
  }
  g->logits = detail::build_cached_forward(model_, s, kv_.layers, passes_, g->graph);
  g->mask.resize(size_t(s.mask.numel()));
  g->ids.resize(size_t(tokens));
  g->positions.resize(size_t(tokens));
  g->last.resize(size_t(outs));
  slot = std::move(g);
  return *slot;
}

void BatchGenerator::run(PassGraph& g) {
  // Every graph shares alloc_'s buffer; placing is needed only when the graph
  // to run is not the one placed last (steady decoding runs one graph).
  if (placed_ != &g) {
    alloc_->alloc(g.graph);
    placed_ = &g;
  }
  g.step.ids.set<int32_t>(g.ids);
  g.step.positions.set<int32_t>(g.positions);
  g.step.mask.set<float>(g.mask);
  g.step.last.set<int32_t>(g.last);
  backend_.compute(g.graph);
}

// The new keys and values of tokens [token, token + n) of the pass just run go
// to positions [pos, pos + n) of cache row `row`.
void BatchGenerator::append_kv(PassGraph& g, int64_t token, int64_t row, int64_t pos, int64_t n) {
  const size_t per_pos = size_t(kv_.kv_heads * kv_.head_dim) * sizeof(float);
  const size_t dst = (size_t(row) * size_t(capacity_) + size_t(pos)) * per_pos;
  for (size_t l = 0; l < size_t(kv_.layers); ++l) {
    copy_bytes(g.step.k_new[l].node(), size_t(token) * per_pos, k_cache_[l].node(), dst,
               size_t(n) * per_pos);
    copy_bytes(g.step.v_new[l].node(), size_t(token) * per_pos, v_cache_[l].node(), dst,
               size_t(n) * per_pos);
  }
}

int64_t BatchGenerator::start(std::span<const int32_t> prompt, bool reuse_prefix) {
  const int64_t n = int64_t(prompt.size()), V = model_.vocab_size();
  if (active() == max_seqs_)
    fail("generate", "all ", max_seqs_, " sequences are active (finish one before starting one)");
  if (n == 0) fail("generate", "no tokens to run (an empty prompt)");
  for (int64_t i = 0; i < n; ++i)
    if (prompt[size_t(i)] < 0 || prompt[size_t(i)] >= V)
      fail("generate", "token id ", prompt[size_t(i)], " (at index ", i,
           ") is outside the model's vocabulary of ", V, " ids");
  if (n > capacity_)
    fail("generate", "a prompt of ", n, " tokens does not fit the cache of ", capacity_,
         " positions (GeneratorOptions::max_seq_len; the model takes ", model_.max_seq_len(), ")");
  const int64_t row = active();
  // The free row whose kept tokens share the longest prefix with the prompt
  // (the last prompt token always runs: its logits are needed).
  int64_t from = row, reuse = 0;
  if (reuse_prefix)
    for (int64_t f = row; f < max_seqs_; ++f) {
      const std::vector<int32_t>& k = kept_[size_t(f)];
      const int64_t most = std::min(int64_t(k.size()), n - 1);
      int64_t common = 0;
      while (common < most && k[size_t(common)] == prompt[size_t(common)]) ++common;
      if (common > reuse) from = f, reuse = common;
    }
  if (from != row) {  // copy the prefix's keys and values into this row
    const size_t per_pos = size_t(kv_.kv_heads * kv_.head_dim) * sizeof(float);
    const size_t row_bytes = size_t(capacity_) * per_pos, bytes = size_t(reuse) * per_pos;
    for (size_t l = 0; l < size_t(kv_.layers); ++l) {
      copy_bytes(k_cache_[l].node(), size_t(from) * row_bytes, k_cache_[l].node(),
                 size_t(row) * row_bytes, bytes);
      copy_bytes(v_cache_[l].node(), size_t(from) * row_bytes, v_cache_[l].node(),
                 size_t(row) * row_bytes, bytes);
    }
  }
  kept_[size_t(row)].clear();  // the row is this sequence's now
  const int64_t window = model_.config().llama ? model_.config().llama->sliding_window : int64_t(0);
  const float ninf = -std::numeric_limits<float>::infinity();
  PassGraph* g = nullptr;
  int64_t pos = reuse;
  for (int64_t done = reuse; done < n;) {
    const int64_t T = detail::prefill_pass_tokens(n - done, opt_.prefill_chunk),
                  real = std::min(T, n - done);
    const int64_t L = pos == 0 ? 0 : cache_bucket(pos);
    g = &graph_for(row, T, L);
    for (int64_t t = 0; t < T; ++t) {
      g->ids[size_t(t)] = t < real ? prompt[size_t(done + t)] : 0;
      g->positions[size_t(t)] = int32_t(std::min(pos + t, capacity_ - 1));
      float* m = g->mask.data() + t * (L + T);  // as Generator::prefill's mask
      for (int64_t j = 0; j < L; ++j)
        m[j] = j < pos && (window == 0 || pos + t - j < window) ? 0.0f : ninf;
      for (int64_t s = 0; s < T; ++s)
        m[L + s] = s <= t && (window == 0 || t - s < window) ? 0.0f : ninf;
    }
    g->last[0] = int32_t(real - 1);
    run(*g);
    append_kv(*g, 0, row, pos, real);
    pos += real;
    done += real;
  }
  Row r;
  r.seq = next_seq_++;
  r.pos = pos;
  r.reused = reuse;
  r.tokens.assign(prompt.begin(), prompt.end());
  r.logits.resize(size_t(V));
  const TensorNode* out = g->logits.node();
  out->buffer->get(out, r.logits.data(), 0, r.logits.size() * sizeof(float));
  rows_.push_back(std::move(r));
  return rows_.back().seq;
}

void BatchGenerator::step(std::span<const Token> tokens) {
  if (tokens.empty()) return;
  const int64_t V = model_.vocab_size();
  // Pass row b is the sequence in cache row b. The pass covers rows 0..B-1, B
  // past the last row given a token; a row before it without one runs as
  // padding (a dummy token whose keys, values and logits are dropped).
  std::vector<int32_t> id_of_row(rows_.size(), -1);
  for (const Token& t : tokens) {
    const size_t r = row_of(t.seq, "step");
    if (id_of_row[r] >= 0) fail("generate", "step: sequence ", t.seq, " is given twice");
    if (t.id < 0 || t.id >= V)
      fail("generate", "step: token id ", t.id, " for sequence ", t.seq,
           " is outside the model's vocabulary of ", V, " ids");
    if (rows_[r].pos == capacity_)
      fail("generate", "step: sequence ", t.seq, " fills its cache of ", capacity_, " positions");
    id_of_row[r] = t.id;
  }
  int64_t B = 0;
  for (size_t r = 0; r < rows_.size(); ++r)
    if (id_of_row[r] >= 0) B = int64_t(r) + 1;
  int64_t max_pos = 0;
  for (int64_t b = 0; b < B; ++b) max_pos = std::max(max_pos, rows_[size_t(b)].pos);
  const int64_t L = cache_bucket(max_pos);
  PassGraph& g = graph_for(-1, B, L);
  const int64_t window = model_.config().llama ? model_.config().llama->sliding_window : int64_t(0);
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    const Row& row = rows_[size_t(b)];
    const bool given = id_of_row[size_t(b)] >= 0;
    g.ids[size_t(b)] = given ? id_of_row[size_t(b)] : 0;
    g.positions[size_t(b)] = int32_t(std::min(row.pos, capacity_ - 1));
    g.last[size_t(b)] = int32_t(b);
    float* m = g.mask.data() + b * (L + 1);
    for (int64_t j = 0; j < L; ++j)
      m[j] = j < row.pos && (window == 0 || row.pos - j < window) ? 0.0f : ninf;
    m[L] = 0.0f;  // its own new key
  }
  run(g);
  std::vector<float> all(size_t(B * V));
  const TensorNode* out = g.logits.node();
  out->buffer->get(out, all.data(), 0, all.size() * sizeof(float));
  for (int64_t b = 0; b < B; ++b) {
    Row& row = rows_[size_t(b)];
    if (id_of_row[size_t(b)] < 0) continue;  // padding: its cache and logits stay
    append_kv(g, b, b, row.pos, 1);
    ++row.pos;
    row.tokens.push_back(id_of_row[size_t(b)]);
    std::copy(all.begin() + b * V, all.begin() + (b + 1) * V, row.logits.begin());
  }
}

std::span<const float> BatchGenerator::logits(int64_t seq) const {
  return rows_[row_of(seq, "logits")].logits;
}

int64_t BatchGenerator::position(int64_t seq) const { return rows_[row_of(seq, "position")].pos; }

int64_t BatchGenerator::reused_tokens(int64_t seq) const {
  return rows_[row_of(seq, "reused_tokens")].reused;
}

void BatchGenerator::finish(int64_t seq) {
  const size_t r = row_of(seq, "finish"), last = rows_.size() - 1;
  if (r != last) {  // the last row's sequence moves into the freed row
    const size_t per_pos = size_t(kv_.kv_heads * kv_.head_dim) * sizeof(float);
    const size_t row_bytes = size_t(capacity_) * per_pos, n = size_t(rows_[last].pos) * per_pos;
    for (size_t l = 0; l < size_t(kv_.layers); ++l) {
      copy_bytes(k_cache_[l].node(), last * row_bytes, k_cache_[l].node(), r * row_bytes, n);
      copy_bytes(v_cache_[l].node(), last * row_bytes, v_cache_[l].node(), r * row_bytes, n);
    }
    kept_[last] = rows_[last].tokens;  // the copy's source stays valid
    rows_[r] = std::move(rows_[last]);
  } else {
    kept_[r] = std::move(rows_[r].tokens);
  }
  rows_.pop_back();
}

}  // namespace kiln::models
