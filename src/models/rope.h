// Rotary position embeddings: the tables (with any frequency rescaling) are
// computed here on the host, the rotation is the fused ROPE op (kiln::rope).
// HF's rotate_half convention, where dimension i of a head pairs with i + D/2.
#pragma once
#include <vector>

#include "kiln/models.h"

namespace kiln::models::detail {

// The R/2 inverse frequencies theta^(-2i/R) (R = c.rope_dims()), rescaled as c.rope_scaling (or a
// GGUF file's rope_freqs) says. seq_len: the length of the tables they are for,
// which dynamic NTK scaling (when above max_position_embeddings) and longrope
// (long_factor above original_max_position_embeddings) depend on.
std::vector<double> rope_inv_freq(const LlamaConfig& c, int64_t seq_len = 0);

// The factor yarn and longrope scaling multiply cos and sin by (1 otherwise).
double rope_attention_factor(const LlamaConfig& c);

// longrope: the factors a table of seq_len positions uses (short or long).
const std::vector<double>& longrope_factors(const LlamaConfig& c, int64_t seq_len);

// cos and sin tables [positions, R] (R = c.rope_dims(): the dims RoPE turns,
// head_dim unless partial; row p: angle p * inv_freq[i mod R/2], times
// rope_attention_factor), row-major, for CausalLM::constant.
void rope_tables(const LlamaConfig& c, int64_t positions, std::vector<float>& cos_out,
                 std::vector<float>& sin_out);

// x [B, T, H, D] rotated by position (0 .. T-1): x * cos + rotate_half(x) * sin,
// with cos/sin the tables above ([S, D], S >= T; their first T rows are used, so
// pass tables narrowed at an offset to rotate positions offset .. offset+T-1).
Tensor apply_rope(Tensor x, Tensor cos, Tensor sin);

// x [B, T, H, D] rotated by cos/sin rows [T, R] or [B, T, R] (kiln::rope):
// all of each head when R = D; partial rotary (R < D): its first R dims, the
// rest passed through (HF's Phi-3, partial_rotary_factor).
Tensor rotate(Tensor x, Tensor cos, Tensor sin);

}  // namespace kiln::models::detail
