// Attention over a KV cache. The queries of key/value head j (G = H / Hkv of
// them, times T tokens) are one matrix [G*T, D], so the cache is read once per
// key/value head and never repeated per query head. The scores are computed as
// K q^T ([keys, G*T]): with a single new token that is a matrix times a few
// columns, the dot-product GEMM path that streams the cache rows in place, and
// the weights times V are a few rows times V, which streams V's rows in place.
// The new tokens' own keys and values are a second block of scores (they reach
// the cache only after the pass), so one softmax covers [cache | new].
#include "models/kv_attention.h"

namespace kiln::models::detail {

Tensor rows_at(Tensor table, Tensor positions) { return embedding(table, positions); }

Tensor cached_attention(Tensor q, Tensor k, Tensor v, const KvStep& step, size_t layer,
                        float scale) {
  const int64_t T = q.size(0), H = q.size(1), D = q.size(2), Hkv = k.size(1), G = H / Hkv;
  const int64_t L = step.cached;
  // Rows g*T + t of key/value head j: query head j*G + g of token t.
  Tensor qg =
      T == 1
          ? q.reshape({Hkv, G, D})
          : q.reshape({T, Hkv, G, D}).permute({1, 2, 0, 3}).contiguous().reshape({Hkv, G * T, D});
  Tensor scores = matmul(k.permute({1, 0, 2}), qg.T());  // [Hkv, T, G*T]
  if (L > 0) {
    Tensor kc = step.k_cache[layer].narrow(0, 0, L).permute({1, 0, 2});  // [Hkv, L, D]
    scores = concat({matmul(kc, qg.T()), scores}, 1);                    // [Hkv, L+T, G*T]
  }
  // One softmax row per query: [Hkv, G, T, L+T]; the mask [T, L+T] broadcasts.
  SoftmaxOptions so;
  so.scale = scale;
  so.mask = step.mask;
  Tensor p = softmax(scores.permute({0, 2, 1}).contiguous().reshape({Hkv, G, T, L + T}), so)
                 .reshape({Hkv, G * T, L + T});
  Tensor y = matmul(p.narrow(2, L, T), v.permute({1, 0, 2}));  // [Hkv, G*T, D]
  if (L > 0)
    y = y + matmul(p.narrow(2, 0, L), step.v_cache[layer].narrow(0, 0, L).permute({1, 0, 2}));
  if (T == 1) return y.reshape({1, 1, H * D});
  return y.reshape({Hkv, G, T, D}).permute({2, 0, 1, 3}).contiguous().reshape({1, T, H * D});
}

}  // namespace kiln::models::detail
