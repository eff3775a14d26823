// CROSS_ENTROPY and CROSS_ENTROPY_BACK: logits [N, C] with i32 labels [N], no
// one-hot matrix. A row's loss is logsumexp(row) - row[label], so a -inf logit
// other than the label's adds exp(-inf) = 0 and the loss stays finite (PyTorch's
// result; the composite's 0 * -inf gave NaN). Rows go to threads whole; the mean
// adds the row losses in row order on thread 0, so nothing depends on the
// thread count.
// Masked (CrossEntropyParams: ignore_index and/or per-row weights): rows whose
// label is ignore_index are skipped (never read, so their logits may be
// anything), the rest weighted by w; the mean is sum(w l) / sum(w), in double,
// and 0 (gradient 0) when sum(w) is 0.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/row_ops.h"
#include "backends/cpu/kernels/vec_math.h"
#include "kiln/error.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu {

namespace {

using vm::VF;
constexpr int64_t kW = vm::kW;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

int32_t label_at(const TensorNode* labels, int64_t r) {
  int32_t v;
  std::memcpy(&v, static_cast<const char*>(labels->data) + r * labels->stride[0], 4);
  return v;
}

float weight_at(const TensorNode* w, int64_t r) {
  float v;
  std::memcpy(&v, static_cast<const char*>(w->data) + r * w->stride[0], 4);
  return v;
}

// Does row r count, and with which weight (1 unweighted)?
struct RowWeights {
  const TensorNode* labels;
  const TensorNode* w;  // null: unweighted
  CrossEntropyParams p;
  bool ignored(int64_t r) const { return p.ignore && label_at(labels, r) == p.ignore_index; }
  double weight(int64_t r) const {
    if (ignored(r)) return 0.0;
    return w ? double(weight_at(w, r)) : 1.0;
  }
  // sum(w) over the counted rows: the mean's denominator.
  double total(int64_t n) const {
    double s = 0.0;
    for (int64_t r = 0; r < n; ++r) s += weight(r);
    return s;
  }
};

RowWeights row_weights(const TensorNode* dst, int weight_src) {
  const CrossEntropyParams p = op_params<CrossEntropyParams>(*dst);
  return {dst->src[1], p.has_weight ? dst->src[weight_src] : nullptr, p};
}

// Every thread checks every label (cheap), so all of them report the first bad one.
void check_labels(const RowWeights& rw, int64_t n, int64_t classes) {
  for (int64_t r = 0; r < n; ++r) {
    const int32_t v = label_at(rw.labels, r);
    if ((v < 0 || v >= classes) && !rw.ignored(r))
      fail("cross_entropy", "label ", v, " at position ", r, " is out of range [0, ", classes, ")");
  }
}

const float* logits_row(const TensorNode* x, int64_t r, int64_t c, float* buf) {
  const char* p = static_cast<const char*>(x->data) + r * x->stride[0];
  return f32_row(p, x->dtype, x->stride[1], c, buf);
}

// max and log(sum(exp(x - max))) of a row.
std::pair<float, float> max_and_log_sum(const float* x, int64_t c) {
  const float mx = row_max(x, c);
  return {mx, vm::log(exp_sum(x, c, mx))};
}

}  // namespace

void kernel_CROSS_ENTROPY(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const TensorNode* labels = dst->src[1];
  const int64_t n = x->shape[0], c = x->shape[1];
  const RowWeights rw = row_weights(dst, 2);
  check_labels(rw, n, c);
  float* out = static_cast<float*>(dst->data);
  if (n == 0) {
    // The plain mean of nothing is NaN, as PyTorch; masked, nothing counts: 0.
    if (t.ith == 0) *out = rw.p.masked() ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    return;
  }
  // Collective (holds barriers): every thread calls it.
  double* loss = static_cast<double*>(t.shared_scratch(size_t(n) * sizeof(double)));
  const Range r = thread_range(t, n, 4 * c, 1);
  float* buf = r.empty() ? nullptr : static_cast<float*>(t.scratch(size_t(c) * sizeof(float)));
  for (int64_t i = r.begin; i < r.end; ++i) {
    if (rw.ignored(i)) {
      loss[i] = 0.0;
      continue;
    }
    const float* row = logits_row(x, i, c, buf);
    const auto [mx, ls] = max_and_log_sum(row, c);
    // (max - target) + log(sum): keeps precision when |max| is large.
    loss[i] = double((mx - row[label_at(labels, i)]) + ls);
  }
  t.barrier();
  if (t.ith != 0) return;
  double s = 0.0;
  if (!rw.p.masked()) {
    for (int64_t i = 0; i < n; ++i) s += loss[i];
    *out = float(s / double(n));
    return;
  }
  double d = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double w = rw.weight(i);
    if (w != 0.0) s += w * loss[i];  // a weight of 0 drops even an infinite loss
    d += w;
  }
  *out = d == 0.0 ? 0.0f : float(s / d);
}

// d logits[r, j] = (softmax(row r)[j] - (j == label r)) * d loss / N; masked,
// the factor is w_r d loss / sum(w), and 0 for rows that do not count.
void kernel_CROSS_ENTROPY_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const TensorNode* labels = dst->src[1];
  const TensorNode* gl = dst->src[2];
  const int64_t n = x->shape[0], c = x->shape[1];
  const RowWeights rw = row_weights(dst, 3);
  check_labels(rw, n, c);
  const Range r = thread_range(t, n, 4 * c, 1);
  if (r.empty()) return;
  float g;
  std::memcpy(&g, gl->data, sizeof g);
  // Masked: each thread sums the weights itself (N loads, no barrier needed).
  const double total = rw.p.masked() ? rw.total(n) : 0.0;
  const float g_row = !rw.p.masked() ? g / float(n)
                      : total == 0.0 ? 0.0f
                                     : float(double(g) / total);
  // A bf16 dst (a cast fused into the op, Graph::fuse_bf16_casts): each row is
  // computed in f32 into a scratch row, then rounded as a COPY to bf16 would.
  const bool to_bf16 = dst->dtype == DType::bf16;
  float* buf = static_cast<float*>(t.scratch(size_t(to_bf16 ? 2 * c : c) * sizeof(float)));
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    float* o = to_bf16 ? buf + c : out + i * c;
    // A row that counts for nothing (ignored, weight 0 or no counted row at all)
    // gets an exact 0, whatever its logits.
    const float gs = rw.p.masked() ? float(rw.weight(i)) * g_row : g_row;
    if (rw.p.masked() && gs == 0.0f) {
      std::fill(o, o + c, 0.0f);
      if (to_bf16) f32_to_bf16_n(o, static_cast<uint16_t*>(dst->data) + i * c, c);
      continue;
    }
    const VF vgs = vm::c<VF>(gs);
    const float* row = logits_row(x, i, c, buf);
    const auto [mx, ls] = max_and_log_sum(row, c);
    const VF vmx = vm::c<VF>(mx), vls = vm::c<VF>(ls);
    for (int64_t j = 0; j < c; j += kW) {
      const int m = int(std::min(kW, c - j));
      vm::store(o + j, vm::exp((vm::loadv<VF>(row + j, m) - vmx) - vls) * vgs, m);
    }
    o[label_at(labels, i)] -= gs;
    if (to_bf16) f32_to_bf16_n(o, static_cast<uint16_t*>(dst->data) + i * c, c);
  }
}

}  // namespace kiln::cpu
