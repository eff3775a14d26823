// CROSS_ENTROPY and CROSS_ENTROPY_BACK: logits [N, C] with i32 labels [N], no
// one-hot matrix. A row's loss is logsumexp(row) - row[label], so a -inf logit
// other than the label's adds exp(-inf) = 0 and the loss stays finite (PyTorch's
// result; the composite's 0 * -inf gave NaN). Rows go to threads whole; the mean
// adds the row losses in row order on thread 0, so nothing depends on the
// thread count.
#include <cmath>
#include <cstring>
#include <limits>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/row_ops.h"
#include "backends/cpu/kernels/vec_math.h"
#include "kiln/error.h"
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

// Every thread checks every label (cheap), so all of them report the first bad one.
void check_labels(const TensorNode* labels, int64_t n, int64_t classes) {
  for (int64_t r = 0; r < n; ++r) {
    const int32_t v = label_at(labels, r);
    if (v < 0 || v >= classes)
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
  check_labels(labels, n, c);
  float* out = static_cast<float*>(dst->data);
  if (n == 0) {
    if (t.ith == 0) *out = std::numeric_limits<float>::quiet_NaN();  // mean of nothing, as PyTorch
    return;
  }
  // Collective (holds barriers): every thread calls it.
  double* loss = static_cast<double*>(t.shared_scratch(size_t(n) * sizeof(double)));
  const Range r = thread_range(t, n, 4 * c, 1);
  float* buf = r.empty() ? nullptr : static_cast<float*>(t.scratch(size_t(c) * sizeof(float)));
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* row = logits_row(x, i, c, buf);
    const auto [mx, ls] = max_and_log_sum(row, c);
    // (max - target) + log(sum): keeps precision when |max| is large.
    loss[i] = double((mx - row[label_at(labels, i)]) + ls);
  }
  t.barrier();
  if (t.ith != 0) return;
  double s = 0.0;
  for (int64_t i = 0; i < n; ++i) s += loss[i];
  *out = float(s / double(n));
}

// d logits[r, j] = (softmax(row r)[j] - (j == label r)) * d loss / N.
void kernel_CROSS_ENTROPY_BACK(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const TensorNode* labels = dst->src[1];
  const TensorNode* gl = dst->src[2];
  const int64_t n = x->shape[0], c = x->shape[1];
  check_labels(labels, n, c);
  const Range r = thread_range(t, n, 4 * c, 1);
  if (r.empty()) return;
  float g;
  std::memcpy(&g, gl->data, sizeof g);
  const float gs = g / float(n);
  const VF vgs = vm::c<VF>(gs);
  // A bf16 dst (a cast fused into the op, Graph::fuse_bf16_casts): each row is
  // computed in f32 into a scratch row, then rounded as a COPY to bf16 would.
  const bool to_bf16 = dst->dtype == DType::bf16;
  float* buf = static_cast<float*>(t.scratch(size_t(to_bf16 ? 2 * c : c) * sizeof(float)));
  float* out = static_cast<float*>(dst->data);
  for (int64_t i = r.begin; i < r.end; ++i) {
    const float* row = logits_row(x, i, c, buf);
    const auto [mx, ls] = max_and_log_sum(row, c);
    const VF vmx = vm::c<VF>(mx), vls = vm::c<VF>(ls);
    float* o = to_bf16 ? buf + c : out + i * c;
    for (int64_t j = 0; j < c; j += kW) {
      const int m = int(std::min(kW, c - j));
      vm::store(o + j, vm::exp((vm::loadv<VF>(row + j, m) - vmx) - vls) * vgs, m);
    }
    o[label_at(labels, i)] -= gs;
    if (to_bf16) f32_to_bf16_n(o, static_cast<uint16_t*>(dst->data) + i * c, c);
  }
}

}  // namespace kiln::cpu
