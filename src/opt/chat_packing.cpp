// kiln/chat_dataset.h: chat examples packed into windows (ChatPacking), and
// the per-epoch permutations that batches draw their rows from.
#include <algorithm>
#include <numeric>
#include <random>

#include "kiln/chat_dataset.h"
#include "kiln/error.h"
#include "kiln/ops.h"

namespace kiln {
namespace {
constexpr const char* kPackingOp = "chat data";

// Input positions an example takes: one per token that has a next token.
int64_t input_positions(const ChatExample& e) {
  return std::max<int64_t>(0, int64_t(e.ids.size()) - 1);
}
}  // namespace

ChatPacking pack_chat_examples(const ChatDataset& data, int64_t window) {
  if (window < 1) fail(kPackingOp, "packing window ", window, " must be >= 1");
  ChatPacking p;
  p.window = window;
  std::vector<int64_t> order(size_t(data.size()));
  std::iota(order.begin(), order.end(), int64_t(0));
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return input_positions(data.examples[size_t(a)]) > input_positions(data.examples[size_t(b)]);
  });
  // First fit in O(log windows): a max-tree over the room left in every
  // window there could be (one per example), unopened ones whole; the
  // leftmost leaf with room is the first window that fits, a new one when no
  // opened window does.
  size_t leaves = 1;
  while (leaves < order.size()) leaves *= 2;
  std::vector<int64_t> room(2 * leaves, window);
  for (const int64_t i : order) {
    const ChatExample& e = data.examples[size_t(i)];
    const int64_t n = input_positions(e);
    if (n > window)
      fail(kPackingOp, data.file, ":", e.line, ": ", e.ids.size(),
           " tokens do not fit a window of ", window);
    if (n == 0) continue;  // a single token has no label: nothing to train or pack
    size_t v = 1;
    while (v < leaves) v = room[2 * v] >= n ? 2 * v : 2 * v + 1;
    const size_t w = v - leaves;
    if (w == p.windows.size()) p.windows.emplace_back();
    p.windows[w].push_back(i);
    p.real_positions += n;
    room[v] -= n;
    for (v /= 2; v >= 1; v /= 2) room[v] = std::max(room[2 * v], room[2 * v + 1]);
  }
  return p;
}

double ChatPacking::efficiency() const {
  const int64_t all = size() * window;
  return all > 0 ? double(real_positions) / double(all) : 0.0;
}

void ChatPacking::write_batch(const ChatDataset& data, std::span<const int64_t> rows, Tensor inputs,
                              Tensor labels, Tensor segments, Tensor positions) const {
  const int64_t B = int64_t(rows.size()), T = window;
  for (const auto& [what, t] :
       {std::pair{"inputs", inputs}, {"segments", segments}, {"positions", positions}})
    if (t.dtype() != DType::i32 || t.shape() != Shape{B, T})
      fail(kPackingOp, what, " ", t.label(), " must be i32 [", B, ", ", T, "] for ", B,
           " windows of ", T, " positions, got ", t.shape().str());
  if (labels.dtype() != DType::i32 || labels.numel() != B * T)
    fail(kPackingOp, "labels ", labels.label(), " must be i32 with B*T = ", B * T, " elements");
  std::vector<int32_t> x(size_t(B * T), 0), y(size_t(B * T), kIgnoreIndex);
  std::vector<int32_t> seg(size_t(B * T), -1), pos(size_t(B * T), 0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = rows[size_t(b)];
    if (r == -1) continue;
    if (r < 0 || r >= size())
      fail(kPackingOp, "window ", r, " outside the ", size(), " packed windows");
    int64_t at = b * T;
    int32_t slot = 0;
    for (const int64_t i : windows[size_t(r)]) {
      const ChatExample& e = data.examples[size_t(i)];
      const int64_t n = input_positions(e);
      for (int64_t t = 0; t < n; ++t, ++at) {
        x[size_t(at)] = e.ids[size_t(t)];
        if (e.trained[size_t(t + 1)]) y[size_t(at)] = e.ids[size_t(t + 1)];
        seg[size_t(at)] = slot;
        pos[size_t(at)] = int32_t(t);
      }
      ++slot;
    }
  }
  inputs.set<int32_t>(x);
  labels.set<int32_t>(y);
  segments.set<int32_t>(seg);
  positions.set<int32_t>(pos);
}

std::vector<int64_t> epoch_rows(int64_t n, uint64_t seed, int64_t step, int64_t per_step, int64_t k,
                                int64_t batch) {
  if (n == 0) fail(kPackingOp, "no examples to draw batches from");
  std::vector<int64_t> perm;
  int64_t perm_epoch = -1;
  std::vector<int64_t> rows(static_cast<size_t>(batch));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t g = (step * per_step + k) * batch + b;  // position in the epoch sequence
    const int64_t epoch = g / n;
    if (epoch != perm_epoch) {
      // Fisher-Yates from the engine's raw output (no std distribution): the
      // same order on every platform.
      std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + uint64_t(epoch));
      perm.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) perm[size_t(i)] = i;
      for (int64_t i = n - 1; i > 0; --i) std::swap(perm[size_t(i)], perm[rng() % uint64_t(i + 1)]);
      perm_epoch = epoch;
    }
    rows[size_t(b)] = perm[size_t(g % n)];
  }
  return rows;
}

}  // namespace kiln
