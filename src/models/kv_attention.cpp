// Attention over a KV cache. The cache is never repeated per query head: the
// queries of key/value head j (G = H / Hkv of them, times T tokens) read it
// through a broadcast batch dim or as one matrix [G*T, D]. The new tokens' own
// keys and values are a second block of scores (they reach the cache only after
// the pass), so one softmax covers [cache | new].
#include "models/kv_attention.h"

#include <algorithm>
#include <bit>

#include "kiln/ext/alloc.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::models::detail {

Tensor rows_at(Tensor table, Tensor positions) { return embedding(table, positions); }

namespace {

// Rows 0..L-1 of a cache [S, Hkv, 1, D] as [Hkv, 1, L, D] (a view).
Tensor cache_rows(Tensor cache, int64_t L) { return cache.narrow(0, 0, L).permute({1, 2, 0, 3}); }

// One new token: each query row [1, D] times K^T of its key/value head is a
// row times a transposed matrix (the matrix-vector kernel over the cache rows
// in place), and the scores come out as [Hkv, G, 1, keys], the softmax's layout.
Tensor attend_one(Tensor q, Tensor k, Tensor v, const KvStep& step, size_t layer, float scale) {
  const int64_t H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv, L = step.cached;
  Tensor q4 = q.reshape({Hkv, G, 1, D});
  Tensor kn = k.reshape({Hkv, 1, 1, D}), vn = v.reshape({Hkv, 1, 1, D});
  Tensor scores = matmul(q4, kn.T());  // [Hkv, G, 1, 1]
  if (L > 0) scores = concat({matmul(q4, cache_rows(step.k_cache[layer], L).T()), scores}, 3);
  SoftmaxOptions so;
  so.scale = scale;
  so.mask = step.mask;                       // [1, L + 1]
  Tensor p = softmax(scores, so);            // [Hkv, G, 1, L + 1]
  Tensor y = matmul(p.narrow(3, L, 1), vn);  // [Hkv, G, 1, D]
  if (L > 0) y = y + matmul(p.narrow(3, 0, L), cache_rows(step.v_cache[layer], L));
  return y.reshape({1, 1, H * D});
}

// One new token of each of B sequences: the same products as attend_one with
// the sequences as a batch dim, each reading its own cache row [B, S, Hkv, D]
// (the view [B, Hkv, L, D]). The row-wise parts of the layer (projections,
// norms, MLP) see the B tokens as one matrix, so their weights are read once.
Tensor attend_batch(Tensor q, Tensor k, Tensor v, const KvStep& step, size_t layer, float scale) {
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv;
  const int64_t L = step.cached;
  auto rows = [&](Tensor cache) {
    return cache.narrow(0, 0, B).narrow(1, 0, L).permute({0, 2, 1, 3});
  };
  Tensor q4 = q.reshape({B, Hkv, G, D});
  Tensor kn = k.reshape({B, Hkv, 1, D}), vn = v.reshape({B, Hkv, 1, D});
  Tensor scores = matmul(q4, kn.T());  // [B, Hkv, G, 1]
  if (L > 0) scores = concat({matmul(q4, rows(step.k_cache[layer]).T()), scores}, 3);
  SoftmaxOptions so;
  so.scale = scale;
  so.mask = step.mask;                       // [B, 1, 1, L + 1]
  Tensor p = softmax(scores, so);            // [B, Hkv, G, L + 1]
  Tensor y = matmul(p.narrow(3, L, 1), vn);  // [B, Hkv, G, D]
  if (L > 0) y = y + matmul(p.narrow(3, 0, L), rows(step.v_cache[layer]));
  return y.reshape({1, B, H * D});
}

}  // namespace

Tensor cached_attention(Tensor q, Tensor k, Tensor v, const KvStep& step, size_t layer,
                        float scale) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv;
  const int64_t L = step.cached;
  if (step.batch > 0) return attend_batch(q, k, v, step, layer, scale);
  if (T == 1) return attend_one(q, k, v, step, layer, scale);
  // Rows g*T + t of key/value head j: query head j*G + g of token t.
  Tensor qg =
      q.reshape({T, Hkv, G, D}).permute({1, 2, 0, 3}).contiguous().reshape({Hkv, 1, G * T, D});
  Tensor kn = k.reshape({T, Hkv, 1, D}).permute({1, 2, 0, 3});  // [Hkv, 1, T, D]
  Tensor vn = v.reshape({T, Hkv, 1, D}).permute({1, 2, 0, 3});
  Tensor scores = matmul(kn, qg.T());  // [Hkv, 1, T, G*T]
  if (L > 0)                           // [Hkv, 1, L + T, G*T]
    scores = concat({matmul(cache_rows(step.k_cache[layer], L), qg.T()), scores}, 2);
  // One softmax row per query: [Hkv, G, T, L+T]; the mask [T, L+T] broadcasts.
  SoftmaxOptions so;
  so.scale = scale;
  so.mask = step.mask;
  Tensor p = softmax(scores.permute({0, 1, 3, 2}).contiguous().reshape({Hkv, G, T, L + T}), so)
                 .reshape({Hkv, 1, G * T, L + T});
  Tensor y = matmul(p.narrow(3, L, T), vn);  // [Hkv, 1, G*T, D]
  if (L > 0) y = y + matmul(p.narrow(3, 0, L), cache_rows(step.v_cache[layer], L));
  return y.reshape({Hkv, G, T, D}).permute({2, 0, 1, 3}).contiguous().reshape({1, T, H * D});
}

int64_t kv_cache_bucket(int64_t pos, int64_t capacity) {
  const int64_t b = pos <= 256 ? int64_t(std::bit_ceil(uint64_t(std::max<int64_t>(pos, 16))))
                               : (pos + 255) / 256 * 256;
  return std::min(b, capacity);
}

int64_t prefill_pass_tokens(int64_t rem, int64_t chunk) {
  if (rem >= chunk) return chunk;
  const auto u = uint64_t(rem);
  const auto up = int64_t(std::bit_ceil(u)), down = int64_t(std::bit_floor(u));
  return (up - rem) * 4 <= rem && up <= chunk ? up : down;
}

Tensor build_cached_forward(CausalLM& model, KvStep& step, int64_t layers, GraphPasses passes,
                            Graph& graph) {
  Tensor logits = model.forward_cached(step);
  if (int64_t(step.k_new.size()) != layers || int64_t(step.v_new.size()) != layers)
    fail("generate", model.type_name(), "::forward_cached gave ", step.k_new.size(),
         " new key tensors for ", layers, " layers");
  graph = Graph::forward(logits);
  for (Tensor t : step.k_new) graph.expand(t);
  for (Tensor t : step.v_new) graph.expand(t);
  run_graph_passes(graph, passes);
  return logits;
}

std::unique_ptr<Buffer> place_zeroed_caches(BufferType& bt, const std::vector<Tensor>& k_cache,
                                            const std::vector<Tensor>& v_cache) {
  TensorAllocator measure(bt);
  for (const Tensor& t : k_cache) measure.alloc(t.node());
  for (const Tensor& t : v_cache) measure.alloc(t.node());
  std::unique_ptr<Buffer> buf = bt.alloc(std::max(measure.high_water(), bt.alignment()));
  buf->clear(0);
  TensorAllocator place(*buf);
  for (const Tensor& t : k_cache) place.place(t.node());
  for (const Tensor& t : v_cache) place.place(t.node());
  return buf;
}

}  // namespace kiln::models::detail
