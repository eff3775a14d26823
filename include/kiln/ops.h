// Building ops: each function checks shapes and dtypes (kiln::Error "[op] ...")
// and adds one node (or a few, for composite ops) to the inputs' Context.
// Nothing is computed here.
#pragma once
#include <initializer_list>
#include <optional>
#include <utility>
#include <vector>

#include "kiln/context.h"
#include "kiln/tensor.h"

namespace kiln {

// ---- constants ----
[[nodiscard]] Tensor full(Context& ctx, const Shape& s, float value, DType t = f32);
[[nodiscard]] Tensor zeros(Context& ctx, const Shape& s, DType t = f32);
[[nodiscard]] Tensor ones(Context& ctx, const Shape& s, DType t = f32);
[[nodiscard]] Tensor full_like(Tensor x, float value);

// ---- elementwise, numpy broadcasting ----
[[nodiscard]] Tensor add(Tensor a, Tensor b);
[[nodiscard]] Tensor sub(Tensor a, Tensor b);
[[nodiscard]] Tensor mul(Tensor a, Tensor b);
[[nodiscard]] Tensor div(Tensor a, Tensor b);
[[nodiscard]] Tensor where(Tensor cond, Tensor a, Tensor b);  // cond != 0 ? a : b
// Comparisons give f32 1/0 and have no gradient.
[[nodiscard]] Tensor eq(Tensor a, Tensor b);
[[nodiscard]] Tensor ne(Tensor a, Tensor b);
[[nodiscard]] Tensor lt(Tensor a, Tensor b);
[[nodiscard]] Tensor le(Tensor a, Tensor b);
[[nodiscard]] Tensor gt(Tensor a, Tensor b);
[[nodiscard]] Tensor ge(Tensor a, Tensor b);
[[nodiscard]] Tensor gt(Tensor a, float b);
[[nodiscard]] Tensor lt(Tensor a, float b);

[[nodiscard]] Tensor neg(Tensor x);
[[nodiscard]] Tensor abs(Tensor x);
[[nodiscard]] Tensor sign(Tensor x);
[[nodiscard]] Tensor sqr(Tensor x);
[[nodiscard]] Tensor sqrt(Tensor x);
[[nodiscard]] Tensor rsqrt(Tensor x);  // 1 / sqrt(x), one op (torch.rsqrt)
[[nodiscard]] Tensor exp(Tensor x);
[[nodiscard]] Tensor log(Tensor x);
[[nodiscard]] Tensor sin(Tensor x);
[[nodiscard]] Tensor cos(Tensor x);
[[nodiscard]] Tensor pow(Tensor x, float exponent);
[[nodiscard]] Tensor scale(Tensor x, float s, float bias = 0.0f);  // s*x + bias
[[nodiscard]] Tensor clamp(Tensor x, float lo, float hi);
[[nodiscard]] Tensor relu(Tensor x);
[[nodiscard]] Tensor leaky_relu(Tensor x, float negative_slope = 0.01f);
enum class GeluApprox { none, tanh };  // PyTorch's approximate='none' | 'tanh'
[[nodiscard]] Tensor gelu(Tensor x, GeluApprox approx = GeluApprox::none);
[[nodiscard]] Tensor erf(Tensor x);
[[nodiscard]] Tensor silu(Tensor x);
[[nodiscard]] Tensor sigmoid(Tensor x);
[[nodiscard]] Tensor tanh(Tensor x);
[[nodiscard]] Tensor softplus(Tensor x);

[[nodiscard]] Tensor operator+(Tensor a, Tensor b);
[[nodiscard]] Tensor operator-(Tensor a, Tensor b);
[[nodiscard]] Tensor operator*(Tensor a, Tensor b);
[[nodiscard]] Tensor operator/(Tensor a, Tensor b);
[[nodiscard]] Tensor operator-(Tensor a);
[[nodiscard]] Tensor operator+(Tensor a, float b);
[[nodiscard]] Tensor operator-(Tensor a, float b);
[[nodiscard]] Tensor operator*(Tensor a, float b);
[[nodiscard]] Tensor operator/(Tensor a, float b);
[[nodiscard]] Tensor operator+(float a, Tensor b);
[[nodiscard]] Tensor operator-(float a, Tensor b);
[[nodiscard]] Tensor operator*(float a, Tensor b);

// ---- reductions: over all elements, or one axis (negative counts from the end) ----
[[nodiscard]] Tensor sum(Tensor x);
[[nodiscard]] Tensor sum(Tensor x, int axis, bool keepdim = false);
[[nodiscard]] Tensor mean(Tensor x);
[[nodiscard]] Tensor mean(Tensor x, int axis, bool keepdim = false);
[[nodiscard]] Tensor max(Tensor x);
[[nodiscard]] Tensor max(Tensor x, int axis, bool keepdim = false);
[[nodiscard]] Tensor argmax(Tensor x, int axis, bool keepdim = false);  // i32, no gradient
[[nodiscard]] Tensor count_equal(Tensor a, Tensor b);                   // i32 scalar, no gradient
// The indices (i32 [..., k]) of the k largest values along x's last axis,
// largest first; equal values keep the lower index first, NaN counts as the
// largest (torch.topk(x, k).indices). No gradient: the values are
// gather_last(x, topk_indices(x, k)), through which gradients flow.
[[nodiscard]] Tensor topk_indices(Tensor x, int64_t k);
// Sums x over broadcast dims so the result has `shape` (used by backward rules).
[[nodiscard]] Tensor sum_to(Tensor x, const Shape& shape);

// ---- linear algebra ----
// a @ b. a [..., M, K], b [..., K, N], batch dims broadcast; f32/f16/bf16 inputs,
// f32 result. Transposed views (x.T()) are read in place without a copy.
[[nodiscard]] Tensor matmul(Tensor a, Tensor b);
// Each token times its chosen experts' weights (ggml's mul_mat_id), one op:
// x [N, K] (or [N, k, K]: one row per chosen expert), w [E, M, K] the E experts'
// [M, K] weights stacked (as GGUF's 3-D ffn_*_exps), ids i32 [N, k] each
// token's experts -> f32 [N, k, M] with out[n, j] = w[ids[n, j]] @ x[n] (x[n, j]).
// w is f32, f16, bf16 or a quantized type read as stored (blocks along K; or
// along M for w_stored.permute({0, 2, 1}), the backward's transpose). Tokens are
// grouped by expert, so each chosen expert's weights are read once per call and
// the others not at all. Gradients: x, and w (quantized w must be frozen); an
// expert that no token chose gets 0. An id outside [0, E) is a kiln::Error at
// run time naming the op, the position and E.
[[nodiscard]] Tensor expert_matmul(Tensor x, Tensor w, Tensor ids);

// ---- neural-net ----
struct SoftmaxOptions {
  float scale = 1.0f;
  Tensor mask;          // optional additive mask, broadcast to x
  bool causal = false;  // mask col c > r + (cols - rows) in row r
};
[[nodiscard]] Tensor softmax(Tensor x, const SoftmaxOptions& opt = {});  // over the last axis
[[nodiscard]] Tensor log_softmax(Tensor x, const SoftmaxOptions& opt = {});
// Scaled dot-product attention, one fused primitive (FlashAttention-style CPU
// kernel: memory O(T) per head, never the [Tq, Tk] scores).
// q [..., Tq, E], k and v [..., Tk, E] with the same leading dims (e.g. [B, H, T, E])
// -> softmax(scale * q k^T (+ causal mask)) v, [..., Tq, E].
struct AttentionOptions {
  float scale = 0.0f;   // 0: 1/sqrt(E) (PyTorch's default)
  bool causal = false;  // key j masked for query i when j > i + (Tk - Tq), as softmax's
  // Packed examples: i32 [S, T] segment ids (Tq = Tk = T; S divides the heads,
  // the product of q's leading dims, and head h reads row h / (heads / S):
  // [B, T] for q [B, H, T, E]). Query i sees key j only when both lie in one run
  // of equal ids (one example), on top of causal. Undefined: no segments.
  Tensor segments;
  // Dropout on the softmax weights inside the fused kernel (training): each
  // weight zeroed with probability `dropout` in [0, 1), the rest scaled by
  // 1 / (1 - dropout); the mask is dropout()'s for the [..., Tq, Tk] weights
  // with the same seed and seed_tensor (a pure function of seed and position,
  // recomputed by the backward, never stored). seed_tensor (i32, optional,
  // element 0 xor-ed into seed) lets a training loop vary the mask per step
  // without rebuilding the graph. 0: no dropout (and the seeds are ignored).
  float dropout = 0.0f;
  uint64_t seed = 0;
  Tensor seed_tensor;
};
[[nodiscard]] Tensor attention(Tensor q, Tensor k, Tensor v, const AttentionOptions& opt = {});
// Rotary position embeddings (HF's rotate_half convention), one fused primitive:
// x [B, T, H, D] -> x * cos + rotate_half(x) * sin, with cos/sin [T, D] (row t:
// the angles of position t; narrow longer tables at a KV cache's offset) or
// [B, T, D] (per sequence: positions that restart per packed example, the
// tables' rows gathered by embedding(positions, table)).
[[nodiscard]] Tensor rope(Tensor x, Tensor cos, Tensor sin);
// Mean cross-entropy of logits [N, C] with i32 labels [N] or f32 probabilities [N, C].
[[nodiscard]] Tensor cross_entropy(Tensor logits, Tensor target);
// PyTorch's ignore_index default: the label of tokens that get no loss.
inline constexpr int32_t kIgnoreIndex = -100;
// cross_entropy over i32 labels with masking and weights. Rows whose label is
// ignore_index count for nothing (no loss, no gradient); weight (f32 [N],
// optional) weighs each row's loss: the result is sum(w * loss) / sum(w) over
// the counted rows (w = 1 without weights). Where nothing counts (every label
// ignored, or sum(w) = 0) the loss is 0 with a zero gradient, not PyTorch's
// NaN: a batch of a trainer's that holds no trained token adds nothing. The
// weights are constants: a weight that wants a gradient is an error.
struct CrossEntropyOptions {
  std::optional<int32_t> ignore_index;  // kIgnoreIndex for PyTorch's default
  Tensor weight;                        // optional per-row weights [N]
};
[[nodiscard]] Tensor cross_entropy(Tensor logits, Tensor labels, const CrossEntropyOptions& opt);
[[nodiscard]] Tensor mse_loss(Tensor a, Tensor b);             // mean((a-b)^2)
[[nodiscard]] Tensor one_hot(Tensor labels, int64_t classes);  // f32, no gradient
// Over the last axis; weight and bias (shape [D]) are optional.
[[nodiscard]] Tensor layer_norm(Tensor x, Tensor weight = {}, Tensor bias = {}, float eps = 1e-5f);
[[nodiscard]] Tensor rms_norm(Tensor x, Tensor weight = {}, float eps = 1e-6f);
// Rows of weight [V, D] (f32, f16 or bf16) at i32 indices, as f32.
[[nodiscard]] Tensor embedding(Tensor weight, Tensor indices);
// x[..., idx[..., j]] along the last axis (torch.gather(x, -1, idx)): x f32
// [..., C], idx i32 [..., k] with x's leading dims -> [..., k]. A composite
// (x times one_hot(idx, C), summed over C: C * k work per row), so gradients
// flow to x; meant for small C (top-k routing over E experts).
[[nodiscard]] Tensor gather_last(Tensor x, Tensor idx);
[[nodiscard]] Tensor concat(std::initializer_list<Tensor> xs, int dim);
[[nodiscard]] Tensor concat(const std::vector<Tensor>& xs, int dim);
// PyTorch F.pad order: pairs (before, after) starting from the LAST dim.
[[nodiscard]] Tensor pad(Tensor x, std::initializer_list<int64_t> pads, float value = 0.0f);
[[nodiscard]] Tensor repeat(Tensor x, std::initializer_list<int64_t> reps);  // torch.Tensor.repeat
struct Conv2dOptions {
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
};
// x [N, C, H, W], weight [O, C, KH, KW], bias [O] optional -> [N, O, OH, OW].
[[nodiscard]] Tensor conv2d(Tensor x, Tensor weight, Tensor bias = {},
                            const Conv2dOptions& opt = {});
// Sliding windows as columns (torch.nn.functional.unfold / fold, NCHW only).
// unfold: x [N, C, H, W] -> [N, C*KH*KW, L], L = OH*OW windows, each column one
// window (channel-major, then kernel row, kernel column). fold is its adjoint:
// cols [N, C*KH*KW, L] -> [N, C, H, W], summing where windows overlap.
struct UnfoldOptions {
  int64_t kernel[2] = {1, 1};
  int64_t stride[2] = {1, 1};
  int64_t padding[2] = {0, 0};
  int64_t dilation[2] = {1, 1};
};
[[nodiscard]] Tensor unfold(Tensor x, const UnfoldOptions& opt);
[[nodiscard]] Tensor fold(Tensor cols, int64_t out_h, int64_t out_w, const UnfoldOptions& opt);
struct Pool2dOptions {
  int64_t kernel[2] = {2, 2};
  int64_t stride[2] = {0, 0};  // 0: same as kernel (PyTorch default)
  int64_t padding[2] = {0, 0};
};
[[nodiscard]] Tensor max_pool2d(Tensor x, const Pool2dOptions& opt = {});
[[nodiscard]] Tensor avg_pool2d(Tensor x, const Pool2dOptions& opt = {});
// Zeroes each element with probability p and scales the rest by 1/(1-p); the same
// seed gives the same mask. `seed` tensor (i32, optional) is mixed in at run time so
// a training loop can vary the mask per step without rebuilding the graph.
[[nodiscard]] Tensor dropout(Tensor x, float p, uint64_t seed, bool training,
                             Tensor seed_tensor = {});

}  // namespace kiln
