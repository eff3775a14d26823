// Text generation with a key/value cache (docs/models.md#generation): prefill a
// prompt, then decode one token at a time, sampling as kiln/sampling.h says
// (temperature 0: greedy), stopping at the model's end-of-sequence ids.
//
//   auto model = kiln::models::load_pretrained(ctx, cpu, "SmolLM2-135M");
//   kiln::models::Generator gen(*model, cpu);
//   kiln::models::GenerateOptions o;
//   o.max_new_tokens = 64;
//   o.sampling.temperature = 0;  // greedy
//   auto r = gen.generate(prompt_ids, o, [&](int32_t id) { print(id); return true; });
//   // r.ids: the new tokens; r.stats.decode_tokens_per_s()
//
// Each forward pass is a graph built once per shape and reused: T new tokens
// reading the first L rows of per-layer cache tensors, with the positions and
// an additive mask as inputs written before each run. L is the cache length
// rounded up to a bucket (powers of two up to 256, then multiples of 256), so a
// decode step runs one of a few graphs, allocates nothing and reads little more
// cache than it uses. The new keys and values are copied into the caches after
// each run.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <tuple>
#include <utility>
#include <vector>

#include "kiln/backend.h"
#include "kiln/graph_passes.h"
#include "kiln/models.h"
#include "kiln/sampling.h"

namespace kiln {
class GraphAllocator;  // kiln/ext/alloc.h
}

namespace kiln::models {

// `fallback` with the sampling settings that generation_config.json gives
// (GenerationConfig): do_sample false makes it greedy (temperature 0), and
// temperature, top_k, top_p, min_p and repetition_penalty replace the fallback's.
// A command-line option the user gives should then replace what this returns.
SamplingConfig default_sampling(const GenerationConfig& g, SamplingConfig fallback = {});

struct GeneratorOptions {
  // Positions the cache holds (prompt + new tokens). 0: the model's max_seq_len().
  int64_t max_seq_len = 0;
  // The prompt is run in passes of at most this many tokens.
  int64_t prefill_chunk = 256;
  // Graph passes run on each forward graph (kiln/graph_passes.h): those valid
  // for inference graphs (fuse_bias, bf16_gelu_inputs, fuse_casts, fold_casts);
  // a training-only one is a kiln::Error. Only those the backend supports run.
  // Default none: the graphs as the model builds them.
  GraphPasses passes;
};

enum class StopReason { max_tokens, eos, context_full, callback };
const char* stop_reason_name(StopReason r);

struct GenerationStats {
  int64_t prompt_tokens = 0;  // prompt tokens run (those reused from the cache not counted)
  int64_t reused_tokens = 0;  // prompt tokens already in the cache (GenerateOptions::reuse_cache)
  double prompt_seconds = 0;  // the prompt's forward passes
  int64_t new_tokens = 0;     // tokens generated (the eos token included)
  int64_t decode_steps = 0;   // single-token passes run (new_tokens - 1, or fewer)
  double decode_seconds = 0;  // those passes and the sampling
  double prompt_tokens_per_s() const {
    return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0;
  }
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? decode_steps / decode_seconds : 0;
  }
};

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  SamplingConfig sampling;
  // Ids that end generation (the eos token is kept in the result); empty: the
  // model's (config().generation.eos_token_ids).
  std::vector<int64_t> eos_token_ids;
  bool ignore_eos = false;
  // Keep the longest prefix of the prompt that the cache already holds (a
  // chat's earlier turns, a shared system prompt) and run only the rest. The
  // logits then come from other passes than a fresh run's (same values up to
  // float rounding, as any chunking of the prompt gives). false: start afresh.
  bool reuse_cache = false;
};

struct GenerationResult {
  std::vector<int32_t> ids;  // the new tokens only
  StopReason stop = StopReason::max_tokens;
  GenerationStats stats;
};

// Called with each new token as soon as it is sampled; return false to stop.
using TokenCallback = std::function<bool(int32_t id)>;

class Generator {
 public:
  // Puts `model` in eval mode and gives the caches memory on `backend` (the
  // model's weights must live where `backend` can read them).
  Generator(CausalLM& model, Backend& backend, const GeneratorOptions& opt = {});
  ~Generator();
  Generator(const Generator&) = delete;
  Generator& operator=(const Generator&) = delete;

  // Appends `ids` at positions position().. and returns the logits [vocab] that
  // follow the last of them (valid until the next call). Errors: an empty list,
  // an id outside the vocabulary, more tokens than the cache has room for.
  std::span<const float> prefill(std::span<const int32_t> ids);
  std::span<const float> step(int32_t id) { return prefill(std::span<const int32_t>(&id, 1)); }
  // Forgets the cached tokens (position 0).
  void reset() { truncate(0); }
  // Forgets all but the first n cached tokens (n <= position()).
  void truncate(int64_t n);
  // Makes the cache hold exactly `ids`: keeps the longest prefix of them it
  // already holds, forgets the rest and prefills what is left (no logits
  // needed). Returns the tokens run. A chat runs the end of a reply this way
  // (the template's end-of-turn tokens, the reply as the tokenizer splits it)
  // while the user reads, so the next turn's prompt finds all but its new text
  // cached (docs/models.md, "Chat: kiln-lm chat").
  int64_t prefill_uncached(std::span<const int32_t> ids);
  // The tokens the cache holds, positions 0 .. position() - 1.
  std::span<const int32_t> cached_tokens() const { return cached_; }
  int64_t position() const { return pos_; }
  int64_t capacity() const { return capacity_; }

  // reset() (or, with opt.reuse_cache, truncate() to the prompt's prefix that
  // is cached), prefill(prompt), then sample up to max_new_tokens tokens,
  // calling on_token for each; stops early at an eos id, when the cache is
  // full, or when on_token returns false. The cache then holds the prompt and
  // the new tokens but the last (never run).
  GenerationResult generate(std::span<const int32_t> prompt, const GenerateOptions& opt,
                            const TokenCallback& on_token = {});

  // Graphs built so far (one per shape used: tokens per pass, cache rows read).
  size_t graphs() const { return graphs_.size(); }
  // The passes each graph gets: GeneratorOptions::passes the backend supports.
  GraphPasses graph_passes() const { return passes_; }

 private:
  struct StepGraph;
  StepGraph& graph_for(int64_t tokens, int64_t cached);
  int64_t cache_bucket(int64_t pos) const;

  CausalLM& model_;
  Backend& backend_;
  GeneratorOptions opt_;
  GraphPasses passes_;
  KvLayout kv_;
  int64_t capacity_ = 0, pos_ = 0;
  std::vector<int32_t> cached_;  // the token at each cached position
  std::vector<Tensor> k_cache_, v_cache_;
  std::unique_ptr<Buffer> cache_buf_;
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<StepGraph>> graphs_;
  std::vector<float> logits_;
};

// Several sequences decoded together (continuous batching; docs/design.md,
// "Batched decoding"). Each sequence has its own key/value cache; step() runs
// ONE forward pass over the next token of every sequence it is given, so each
// weight is read once per step for all of them. A sequence joins with start()
// (its prompt runs alone, in passes of prefill_chunk tokens) and leaves with
// finish(), both between steps. The logits equal Generator's for the same
// tokens up to float rounding (the products see B rows instead of one).
//
//   kiln::models::BatchGenerator batch(*model, cpu, 4);
//   int64_t a = batch.start(prompt_a), b = batch.start(prompt_b);
//   // sample ta from batch.logits(a), tb from batch.logits(b), then:
//   batch.step({{a, ta}, {b, tb}});  // one pass: both advance one token
//   batch.finish(a);                 // a's cache is free for the next start()
//
// Graphs: a decode pass over B sequences reading L cache rows each (L: the
// longest one's length in Generator's buckets; shorter ones are masked) and a
// prompt pass per shape, as Generator's. Not thread-safe: one thread drives it.
class BatchGenerator {
 public:
  struct Token {
    int64_t seq;  // a sequence start() returned
    int32_t id;   // the token appended to it
  };

  // Caches for `max_sequences` sequences of GeneratorOptions::max_seq_len
  // positions each, on `backend`; puts `model` in eval mode.
  BatchGenerator(CausalLM& model, Backend& backend, int64_t max_sequences,
                 const GeneratorOptions& opt = {});
  ~BatchGenerator();
  BatchGenerator(const BatchGenerator&) = delete;
  BatchGenerator& operator=(const BatchGenerator&) = delete;

  // A new sequence holding `prompt`, run now; returns its id (never reused).
  // reuse_prefix: a free cache row keeps the tokens of the sequence that left
  // it (finish()); the longest prefix of the prompt that one of them holds
  // (all but the prompt's last token at most) is copied instead of run, as
  // GenerateOptions::reuse_cache does for one sequence (reused_tokens()).
  // Errors: no free sequence (active() == max_sequences()), an empty prompt,
  // an id outside the vocabulary, a prompt longer than capacity().
  int64_t start(std::span<const int32_t> prompt, bool reuse_prefix = false);
  // One forward pass appending tokens[i].id to sequence tokens[i].seq (each
  // sequence at most once). Errors: an unknown or repeated sequence, a bad id,
  // a sequence whose cache is full (position() == capacity()).
  void step(std::span<const Token> tokens);
  void step(std::initializer_list<Token> tokens) { step(std::span(tokens.begin(), tokens.size())); }
  // The logits [vocab] after the sequence's last token (valid until the next
  // start, step or finish).
  std::span<const float> logits(int64_t seq) const;
  // Frees the sequence's cache.
  void finish(int64_t seq);

  int64_t position(int64_t seq) const;  // tokens the sequence holds
  // Prompt tokens start() took from a finished sequence's cache instead of running.
  int64_t reused_tokens(int64_t seq) const;
  int64_t active() const { return int64_t(rows_.size()); }
  int64_t max_sequences() const { return max_seqs_; }
  int64_t capacity() const { return capacity_; }  // positions per sequence
  size_t graphs() const { return graphs_.size(); }

 private:
  struct Row {
    int64_t seq = 0, pos = 0, reused = 0;
    std::vector<int32_t> tokens;  // those whose keys and values the cache row holds
    std::vector<float> logits;
  };
  struct PassGraph;
  PassGraph& graph_for(int64_t row, int64_t tokens, int64_t cached);
  void run(PassGraph& g);
  size_t row_of(int64_t seq, const char* what) const;
  int64_t cache_bucket(int64_t pos) const;
  void append_kv(PassGraph& g, int64_t token, int64_t row, int64_t pos, int64_t n);

  CausalLM& model_;
  Backend& backend_;
  GeneratorOptions opt_;
  GraphPasses passes_;
  KvLayout kv_;
  int64_t max_seqs_ = 0, capacity_ = 0, next_seq_ = 0;
  std::vector<Row> rows_;  // the active sequences; sequence rows_[r] lives in cache row r
  // Free cache row r >= active() still holds the keys and values of kept_[r]
  // (the tokens of the sequence that last used it), for start(..., true).
  std::vector<std::vector<int32_t>> kept_;
  std::vector<Tensor> k_cache_,
      v_cache_;  // per layer [max_sequences, capacity, kv_heads, head_dim]
  std::unique_ptr<Buffer> cache_buf_;
  // (row, tokens, cached): a prompt pass of cache row `row`; row -1: a decode
  // pass of `tokens` sequences.
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<PassGraph>> graphs_;
  std::unique_ptr<GraphAllocator> alloc_;  // one buffer for every graph (one runs at a time)
  PassGraph* placed_ = nullptr;            // the graph alloc_ last placed
};

// Perplexity of `ids` under the model: the text is cut into consecutive windows
// of `window` tokens (0: the model's max_seq_len()); in each, every token after
// the first is predicted from those before it in the window. perplexity =
// exp(mean negative log-likelihood over the predicted tokens).
struct PerplexityResult {
  double perplexity = 0;
  double mean_nll = 0;  // nats per predicted token
  int64_t predicted = 0;
  int64_t windows = 0;
  double seconds = 0;
};
PerplexityResult perplexity(CausalLM& model, Backend& backend, std::span<const int32_t> ids,
                            int64_t window = 0);

// How far `model`'s next-token distributions are from `base`'s over `ids` (a
// quantized model against the one it was made from; llama-perplexity
// --kl-divergence's figures), in the windows perplexity() uses: at every
// predicted position, KL(base || model) = sum_v p_base(v) (log p_base(v) - log
// p_model(v)) in nats, averaged, and the share of positions whose most likely
// token is the same. The two models need the same vocabulary size.
struct KlDivergenceResult {
  double mean_kl = 0;                          // nats per predicted token
  double max_kl = 0;                           // the largest at one position
  double top1_agreement = 0;                   // in [0, 1]
  double base_perplexity = 0, perplexity = 0;  // of ids under base and model
  int64_t predicted = 0;
  double seconds = 0;
};
KlDivergenceResult kl_divergence(CausalLM& model, CausalLM& base, Backend& backend,
                                 std::span<const int32_t> ids, int64_t window = 0);

}  // namespace kiln::models
