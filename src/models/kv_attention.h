// Attention of a few new tokens over a key/value cache (KvStep), shared by the
// Llama family and GPT-2. Composites of existing ops.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/backend.h"
#include "kiln/graph.h"
#include "kiln/graph_passes.h"
#include "kiln/models.h"

namespace kiln::models::detail {

// The rows of a step's cos/sin tables (RoPE) or learned positions: table [S, D]
// gathered at step.positions -> [T, D].
Tensor rows_at(Tensor table, Tensor positions);

// q [T, H, D]; k, v [T, Hkv, D] (the new tokens' keys and values, RoPE applied);
// the caches are [S, Hkv, 1, D];
// layer `layer`'s cache rows 0..step.cached-1 come first. Query head h reads
// key/value head h / (H / Hkv). Returns [1, T, H * D].
// With step.batch > 0, token t is the one new token of sequence t and reads its
// own cache (KvStep::batch).
Tensor cached_attention(Tensor q, Tensor k, Tensor v, const KvStep& step, size_t layer,
                        float scale);

// The cache length a pass at position `pos` is built for: powers of two from
// 16 to 256, then multiples of 256, at most `capacity`. Few graph shapes (one
// per bucket), little attention over masked rows.
int64_t kv_cache_bucket(int64_t pos, int64_t capacity);

// Tokens in the next prefill pass with `rem` prompt tokens left: the chunk
// size, else a power of two (padded up when that wastes at most a quarter), so
// few pass shapes (graphs) occur.
int64_t prefill_pass_tokens(int64_t rem, int64_t chunk);

// model.forward_cached(step) as a graph whose outputs are the logits and every
// layer's new keys and values (read back after the run, so no pass folds them
// away), with `passes` applied. Fails when the model gives a key or value
// tensor per layer other than `layers`. Returns the logits.
Tensor build_cached_forward(CausalLM& model, KvStep& step, int64_t layers, GraphPasses passes,
                            Graph& graph);

// One buffer holding every key and value cache tensor, placed in it and zeroed:
// rows past a sequence's cached length are masked, and zero (not garbage) keeps
// 0 * value finite in attention's weighted sum.
std::unique_ptr<Buffer> place_zeroed_caches(BufferType& bt, const std::vector<Tensor>& k_cache,
                                            const std::vector<Tensor>& v_cache);

}  // namespace kiln::models::detail
