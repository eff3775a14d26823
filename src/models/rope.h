// Rotary position embeddings as a composite of existing ops (a fused op may
// replace it later): HF's rotate_half convention, where dimension i of a head
// pairs with dimension i + D/2.
#pragma once
#include <vector>

#include "kiln/models.h"

namespace kiln::models::detail {

// The D/2 inverse frequencies theta^(-2i/D), with Llama 3's rescaling when set.
std::vector<double> rope_inv_freq(const LlamaConfig& c);

// cos and sin tables [positions, D] (row p: angle p * inv_freq[i mod D/2]),
// row-major, for CausalLM::constant.
void rope_tables(const LlamaConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out);

// x [B, T, H, D] rotated by position (0 .. T-1): x * cos + rotate_half(x) * sin,
// with cos/sin the tables above ([S, D], S >= T).
Tensor apply_rope(Tensor x, Tensor cos, Tensor sin);

}  // namespace kiln::models::detail
