// Optimizer steps: ADAMW_STEP and SGD_STEP (see kiln/ops.def). Both
// update the param (src0, which dst aliases) and their state tensors in place,
// element by element; the step's values come from the node's last source, an f32
// tensor laid out as AdamWHyper / SgdHyper (kiln/ext/op_params.h), written on the
// host before each step.
//
// Elementwise, so any split over threads gives the same bits. AdamW runs in SIMD
// vectors over contiguous runs (it has a sqrt and a division per element); SGD
// is a few multiply-adds, which the compiler vectorises, in one scalar loop.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"

namespace kiln::cpu {

namespace {

// The step's values (kiln/ext/op_params.h), gathered from the hp tensor (any
// stride: it may be a view).
template <class H>
H read_hyper_at(const char* p, int64_t st) {
  float v[hyper_floats<H>];
  for (int64_t k = 0; k < hyper_floats<H>; ++k) std::memcpy(&v[k], p + k * st, 4);
  return hyper_from_values<H>(v);
}
template <class H>
H read_hyper(const TensorNode* hp) {
  return read_hyper_at<H>((const char*)hp->data,
                          hp->shape.ndim() ? hp->stride[hp->shape.ndim() - 1] : 4);
}

inline float& at(char* p, int64_t i, int64_t step) {
  return *reinterpret_cast<float*>(p + i * step);
}

}  // namespace

// One AdamW update of n elements, for V in {VF, SF}: the same operation
// sequence (explicitly fused multiply-adds) for the vector body, the masked
// vector tail and the scalar strided path, so an element's result never
// depends on where a thread's slice starts.
struct AdamW {
  float lr, b1, b2, eps, bc1, bc2, gs, keep, c1, c2;

  template <vm::Vec V>
  V step(V p, V g, V& m, V& v) const {
    using vm::c;
    g = g * c<V>(gs);
    m = vm::madd(c<V>(b1), m, c<V>(c1) * g);
    v = vm::madd(c<V>(b2), v, c<V>(c2) * (g * g));
    const V mh = m * c<V>(bc1);
    const V vh = vm::sqrt(v * c<V>(bc2)) + c<V>(eps);
    return vm::madd(c<V>(-lr), mh / vh, p * c<V>(keep));
  }
};

namespace {
// The update's constants from the step's values.
AdamW adamw_of(const AdamWHyper& h) {
  return {h.lr,
          h.beta1,
          h.beta2,
          h.eps,
          h.bias_correction1,
          h.bias_correction2,
          h.grad_scale,
          1.0f - h.lr * h.weight_decay,
          1.0f - h.beta1,
          1.0f - h.beta2};
}
}  // namespace

void kernel_ADAMW_STEP(TensorNode* dst, ThreadCtx& t) {
  TensorNode* p = dst->src[0];
  const TensorNode *g = dst->src[1], *m = dst->src[2], *v = dst->src[3];
  const int64_t n = p->numel();
  Range r = thread_range(t, n, 8, 16);
  if (r.empty()) return;
  const AdamWHyper h = read_hyper<AdamWHyper>(dst->src[4]);
  const AdamW a = adamw_of(h);
  // dst's data is the param's (an alias): read and write through src0's strides.
  auto L = make_layout<4>(p->shape, {p->stride, g->stride, m->stride, v->stride});
  for_each_run(
      L, {(char*)dst->data, (char*)g->data, (char*)m->data, (char*)v->data}, r.begin, r.end,
      [&](const Ptrs<4>& q, int64_t len, const Steps<4>& s) {
        if (s[0] == 4 && s[1] == 4 && s[2] == 4 && s[3] == 4) {
          float *pp = (float*)q[0], *gp = (float*)q[1], *mp = (float*)q[2], *vp = (float*)q[3];
          for (int64_t i = 0; i < len; i += vm::kW) {
            const int k = int(std::min<int64_t>(vm::kW, len - i));
            vm::VF mi = load_lanes(mp + i, 0, k), vi = load_lanes(vp + i, 0, k);
            const vm::VF pi = a.step(load_lanes(pp + i, 0, k), load_lanes(gp + i, 0, k), mi, vi);
            vm::store(mp + i, mi, k);
            vm::store(vp + i, vi, k);
            vm::store(pp + i, pi, k);
          }
          return;
        }
        for (int64_t i = 0; i < len; ++i) {
          vm::SF mi{at(q[2], i, s[2])}, vi{at(q[3], i, s[3])};
          const vm::SF pi = a.step(vm::SF{at(q[0], i, s[0])}, vm::SF{at(q[1], i, s[1])}, mi, vi);
          at(q[2], i, s[2]) = mi.v;
          at(q[3], i, s[3]) = vi.v;
          at(q[0], i, s[0]) = pi.v;
        }
      });
}

namespace {

// The rows of ADAMW_STEP_MULTI's segment table (i32 [S, 4], any strides),
// checked against the flat tensors: a bad row would write outside them.
struct AdamWSegment {
  int64_t po, so, len, group;
};

std::vector<AdamWSegment> read_adamw_segments(const TensorNode* dst) {
  const TensorNode* segs = dst->src[5];
  const int64_t S = segs->shape[0], P = dst->src[0]->numel(), N = dst->src[1]->numel(),
                G = dst->src[4]->shape[0];
  std::vector<AdamWSegment> out(static_cast<size_t>(S));
  int64_t state_end = 0;
  for (int64_t s = 0; s < S; ++s) {
    int64_t f[4];
    for (int c = 0; c < 4; ++c) {
      int32_t x;
      std::memcpy(&x, (const char*)segs->data + s * segs->stride[0] + c * segs->stride[1], 4);
      f[c] = x;
    }
    const AdamWSegment g{f[0], f[1], f[2], f[3]};
    if (g.len < 0 || g.po < 0 || g.po + g.len > P || g.so < state_end || g.so + g.len > N ||
        g.group < 0 || g.group >= G)
      fail("adamw_step_multi", "segment ", s, " (param offset ", g.po, ", state offset ", g.so,
           ", length ", g.len, ", group ", g.group, ") of ", segs->label(),
           " is out of bounds or overlaps the one before (param ", P, " elements, state ", N, ", ",
           G, " groups)");
    state_end = g.so + g.len;
    out[size_t(s)] = g;
  }
  std::vector<std::pair<int64_t, int64_t>> pr;  // param ranges must be disjoint too
  for (const AdamWSegment& g : out)
    if (g.len > 0) pr.emplace_back(g.po, g.po + g.len);
  std::sort(pr.begin(), pr.end());
  for (size_t k = 1; k < pr.size(); ++k)
    if (pr[k].first < pr[k - 1].second)
      fail("adamw_step_multi", "two segments of ", segs->label(), " update param elements [",
           pr[k].first, ", ", std::min(pr[k].second, pr[k - 1].second), ") both");
  return out;
}

}  // namespace

// Threads split the state index range [0, N); each walks the segments that
// meet its slice with ADAMW_STEP's vector code, so an element's bits equal
// what ADAMW_STEP computes for it (param overlaps between segments are refused,
// so no two threads write one param element).
void kernel_ADAMW_STEP_MULTI(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *g = dst->src[1], *m = dst->src[2], *v = dst->src[3], *hp = dst->src[4];
  const std::vector<AdamWSegment> segs = read_adamw_segments(dst);  // every thread checks
  Range r = thread_range(t, g->numel(), 8, 16);
  if (r.empty()) return;
  std::vector<AdamW> groups;
  for (int64_t k = 0; k < hp->shape[0]; ++k)
    groups.push_back(adamw_of(
        read_hyper_at<AdamWHyper>((const char*)hp->data + k * hp->stride[0], hp->stride[1])));
  float* pp = (float*)dst->data;  // the flat param (dst aliases it), contiguous
  const float* gp = (const float*)g->data;
  float *mp = (float*)m->data, *vp = (float*)v->data;
  for (const AdamWSegment& s : segs) {
    const int64_t b = std::max(s.so, r.begin), e = std::min(s.so + s.len, r.end);
    if (b >= e) continue;
    const AdamW& a = groups[size_t(s.group)];
    float* P = pp + s.po + (b - s.so);  // the param element of state index b
    for (int64_t i = b; i < e; i += vm::kW) {
      const int k = int(std::min<int64_t>(vm::kW, e - i));
      vm::VF mi = load_lanes(mp + i, 0, k), vi = load_lanes(vp + i, 0, k);
      const vm::VF pi = a.step(load_lanes(P + (i - b), 0, k), load_lanes(gp + i, 0, k), mi, vi);
      vm::store(mp + i, mi, k);
      vm::store(vp + i, vi, k);
      vm::store(P + (i - b), pi, k);
    }
  }
}

void kernel_SGD_STEP(TensorNode* dst, ThreadCtx& t) {
  TensorNode* p = dst->src[0];
  const TensorNode* g = dst->src[1];
  const bool has_buf = dst->n_src == 4;
  const TensorNode* b = has_buf ? dst->src[2] : g;  // g: a harmless stand-in layout
  const int64_t n = p->numel();
  Range r = thread_range(t, n, 4, 16);
  if (r.empty()) return;
  const SgdHyper h = read_hyper<SgdHyper>(dst->src[dst->n_src - 1]);
  const float lr = h.lr, mu = h.momentum, damp = h.dampening, wd = h.weight_decay,
              gs = h.grad_scale;
  const bool nesterov = h.nesterov != 0.0f, first = h.first_step != 0.0f;
  const float c = 1.0f - damp;
  auto L = make_layout<3>(p->shape, {p->stride, g->stride, b->stride});
  for_each_run(L, {(char*)dst->data, (char*)g->data, (char*)b->data}, r.begin, r.end,
               [&](const Ptrs<3>& q, int64_t len, const Steps<3>& s) {
                 for (int64_t i = 0; i < len; ++i) {
                   float& pi = at(q[0], i, s[0]);
                   float gi = at(q[1], i, s[1]) * gs + wd * pi;
                   if (has_buf) {
                     float& bi = at(q[2], i, s[2]);
                     bi = first ? gi : mu * bi + c * gi;
                     gi = nesterov ? gi + mu * bi : bi;
                   }
                   pi = pi - lr * gi;
                 }
               });
}

}  // namespace kiln::cpu
