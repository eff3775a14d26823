// What the ATTENTION forward (attention_forward.cpp) and backward
// (attention.cpp, attention_small.cpp) kernels share: one head of a [..., T, E]
// operand, the causal and segment visibility rules, the problem's dims and a
// vector dot.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/vec_math.h"
#include "kiln/error.h"
#include "kiln/ext/op_params.h"
#include "kiln/ext/rng.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cpu::attn {

inline int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }

// One head of a [..., T, E] tensor: its base, row/column byte strides, dtype.
struct HeadMat {
  const char* base;
  int64_t rs, cs;
  DType dt;
  // Row i as contiguous floats (the memory itself, or a copy in buf; bf16
  // converted, so the f32 kernels are also the bf16 path of builds without
  // AVX512_BF16).
  const float* row(int64_t i, int64_t e, float* buf) const {
    return f32_row(base + i * rs, dt, cs, e, buf);
  }
  bool operator==(const HeadMat&) const = default;
};

// Head h (the flat index over the leading dims) of t; broadcast (stride 0)
// leading dims give several heads the same memory.
inline HeadMat head_of(const TensorNode* t, int64_t h) {
  const int nd = t->shape.ndim();
  int64_t off = 0;
  for (int d = nd - 3; d >= 0; --d) {
    off += (h % t->shape[d]) * t->stride[d];
    h /= t->shape[d];
  }
  return {static_cast<const char*>(t->data) + off, t->stride[nd - 2], t->stride[nd - 1], t->dtype};
}

// Keys visible to query row i: all Tk, or j <= i + (Tk - Tq) when causal.
inline int64_t visible(int64_t i, int64_t tq, int64_t tk, bool causal) {
  if (!causal) return tk;
  return std::clamp<int64_t>(i + tk - tq + 1, 0, tk);
}

struct Dims {
  int64_t heads, tq, tk, e;
};
inline Dims dims_of(const TensorNode* q, const TensorNode* k) {
  const int nd = q->shape.ndim();
  return {q->numel() / std::max<int64_t>(1, q->shape[nd - 2] * q->shape[nd - 1]), q->shape[nd - 2],
          k->shape[nd - 2], q->shape[nd - 1]};
}

// The keys a query row sees: [lo, hi).
struct KeyRange {
  int64_t lo = 0, hi = 0;
};

// Which keys each query row of a head sees: the causal rule (visible) and,
// with segment ids (packed examples: the node's last source, i32 [S, T],
// Tq = Tk; head h reads row h / (heads / S)), only the keys of the row's own
// run of equal ids. An example is a run, so a row's keys are one range. The
// runs of a segment row are found once (O(T)) when a head of another row is
// asked for; each thread keeps its own.
// The optional sources after ATTENTION's v (ATTENTION_BACK's dO): segment
// ids, then the dropout seed tensor (AttentionParams), each null when absent.
inline const TensorNode* segment_ids(const TensorNode* dst, const AttentionParams& p) {
  return p.segmented ? dst->src[dst->n_src - (p.seeded ? 2 : 1)] : nullptr;
}
inline const TensorNode* seed_tensor(const TensorNode* dst, const AttentionParams& p) {
  return p.seeded ? dst->src[dst->n_src - 1] : nullptr;
}

class KeyRanges {
 public:
  KeyRanges(const TensorNode* dst, const Dims& D, const AttentionParams& p)
      : seg_(segment_ids(dst, p)), D_(D), causal_(p.causal) {
    if (seg_) {
      per_row_ = std::max<int64_t>(1, D.heads / seg_->shape[0]);
      start_.resize(size_t(D.tk));
      end_.resize(size_t(D.tk));
    }
  }
  bool segmented() const { return seg_ != nullptr; }
  KeyRange row(int64_t h, int64_t i) {
    const int64_t hi = visible(i, D_.tq, D_.tk, causal_);
    if (!seg_) return {0, hi};
    const int64_t r = h / per_row_;
    if (r != row_) runs_of(r);
    return {start_[size_t(i)], std::min(hi, end_[size_t(i)])};
  }

 private:
  void runs_of(int64_t r) {
    const char* p = static_cast<const char*>(seg_->data) + r * seg_->stride[0];
    auto id = [&](int64_t t) { return *reinterpret_cast<const int32_t*>(p + t * seg_->stride[1]); };
    const int64_t T = D_.tk;
    for (int64_t t = 0; t < T; ++t)
      start_[size_t(t)] = t > 0 && id(t) == id(t - 1) ? start_[size_t(t - 1)] : t;
    for (int64_t t = T - 1; t >= 0; --t)
      end_[size_t(t)] = t + 1 < T && id(t) == id(t + 1) ? end_[size_t(t + 1)] : t + 1;
    row_ = r;
  }
  const TensorNode* seg_;
  Dims D_;
  bool causal_;
  int64_t per_row_ = 1, row_ = -1;
  std::vector<int64_t> start_, end_;
};

// Dropout on the softmax weights (AttentionParams::keep < 1). The bit of
// (head h, query i, key j) is the dropout op's for element (h Tq + i) Tk + j
// of the [..., Tq, Tk] weights, from the same seed (the seed tensor's element
// 0 xor-ed in), so the fused kernels and the composite drop the same weights,
// and the backward recomputes the bits instead of storing them. A kept
// weight is scaled by 1 / keep.
class DropMask {
 public:
  DropMask(const TensorNode* dst, const AttentionParams& p, const Dims& D)
      : on_(p.keep < 1.0f), inv_keep_(1.0f / p.keep), tq_(D.tq), tk_(D.tk) {
    if (!on_) return;
    // rng_uniform's u = (h >> 40) 2^-24 < keep, on integers: the 24-bit draw
    // x is exact in float, so u < keep iff x < keep 2^24 iff x < ceil(keep
    // 2^24) (exact in double). The same bits, without a u64 -> float
    // conversion per weight.
    threshold_ = uint64_t(std::ceil(double(p.keep) * 16777216.0));
    uint64_t seed = uint64_t(p.seed);
    if (const TensorNode* st = seed_tensor(dst, p)) {
      int32_t s;
      std::memcpy(&s, st->data, 4);
      seed ^= uint64_t(int64_t(s));
    }
    mixed_ = detail::splitmix64(seed);
  }
  bool on() const { return on_; }
  // f[j] = the factor (1 / keep or 0) of key j0 + j of query row i of head h,
  // for j < n.
  void factors(int64_t h, int64_t i, int64_t j0, int64_t n, float* f) const {
    const uint64_t base = uint64_t((h * tq_ + i) * tk_ + j0);
    for (int64_t j = 0; j < n; ++j) f[j] = kept(base + uint64_t(j)) ? inv_keep_ : 0.0f;
  }
  // w[j] *= that factor, for j < n (a row of softmax weights).
  void apply(int64_t h, int64_t i, int64_t j0, int64_t n, float* w) const {
    const uint64_t base = uint64_t((h * tq_ + i) * tk_ + j0);
    for (int64_t j = 0; j < n; ++j) w[j] *= kept(base + uint64_t(j)) ? inv_keep_ : 0.0f;
  }

 private:
  bool kept(uint64_t index) const {
    return (detail::splitmix64(mixed_ ^ index) >> 40) < threshold_;
  }
  bool on_;
  float inv_keep_;
  uint64_t threshold_ = 0;
  int64_t tq_, tk_;
  uint64_t mixed_ = 0;
};

// dot(a, b) over e contiguous floats, vector by vector (a masked tail).
inline float dot(const float* a, const float* b, int64_t e) {
  using vm::VF;
  VF acc = vm::c<VF>(0.0f);
  for (int64_t c = 0; c < e; c += vm::kW) {
    const int m = int(std::min<int64_t>(vm::kW, e - c));
    acc = vm::madd(vm::loadv<VF>(a + c, m), vm::loadv<VF>(b + c, m), acc);
  }
  return vm::hsum(acc);
}

// Where ATTENTION_BACK (dst) writes head h of the gradient of its source i
// (0: q, 1: k, 2: v): f32 rows ld floats apart, unit column stride. Its
// result is flat (1-D: dq, dk, dv one after the other, each contiguous) or
// shaped like the one contiguous tensor that q, k and v are slices of (the
// rule in core/ops/attention.cpp), each gradient placed there as its source
// is in that tensor: the source's element strides, from its element offset
// past the lowest of the three (the slice at the tensor's start).
struct GradRows {
  float* p;
  int64_t ld;
  float* row(int64_t i) const { return p + i * ld; }
};
inline GradRows grad_head(const TensorNode* dst, int i, int64_t h) {
  const TensorNode* s = dst->src[i];
  float* out = static_cast<float*>(dst->data);
  const int nd = s->shape.ndim();
  if (dst->shape.ndim() == 1) {
    int64_t off = h * s->shape[nd - 2] * s->shape[nd - 1];
    for (int j = 0; j < i; ++j) off += dst->src[j]->numel();
    return {out + off, s->shape[nd - 1]};
  }
  const TensorNode *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
  KILN_ASSERT(q->view_src && k->view_src == q->view_src && v->view_src == q->view_src);
  const size_t base = std::min({q->view_offs, k->view_offs, v->view_offs});
  const int64_t es = int64_t(s->elem_size());
  int64_t off = int64_t(s->view_offs - base) / es;
  for (int d = nd - 3; d >= 0; --d) {
    off += (h % s->shape[d]) * (s->stride[d] / es);
    h /= s->shape[d];
  }
  return {out + off, s->stride[nd - 2] / es};
}

}  // namespace kiln::cpu::attn
