// Attention of a few new tokens over a key/value cache (KvStep), shared by the
// Llama family and GPT-2. Composites of existing ops.
#pragma once
#include <cstddef>

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

}  // namespace kiln::models::detail
