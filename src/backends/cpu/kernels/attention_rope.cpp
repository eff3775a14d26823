// ROPE and ROPE_BACK: rotate-half rotary embeddings of x [B, T, H, D] with
// cos/sin tables [T, D] (any strides, e.g. a narrow of longer tables at a KV
// cache's offset) or [B, T, D] (per sequence: packed examples' positions). Rows (b, t, h) go to
// threads whole; each step loads the pair of vectors x[j..], x[j+D/2..] and writes both results, so
// reading every element before it is written makes in place safe.
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/vec_math.h"

namespace kiln::cpu {

namespace {

using vm::VF;
constexpr int64_t kW = vm::kW;

// kBack: the adjoint (dx from dy): the sin terms trade places and signs.
template <bool kBack>
void rope_rows(TensorNode* dst, ThreadCtx& t) {
  const TensorNode* x = dst->src[0];
  const TensorNode* ct = dst->src[1];
  const TensorNode* st = dst->src[2];
  const int64_t B = x->shape[0], T = x->shape[1], H = x->shape[2], D = x->shape[3], h = D / 2;
  const int64_t rows = B * T * H;
  if (rows == 0 || D == 0) return;
  const Range r = thread_range(t, rows, 3 * D, 1);
  if (r.empty()) return;
  float* buf = static_cast<float*>(t.scratch(size_t(3 * D) * sizeof(float)));
  const char* xp = static_cast<const char*>(x->data);
  const char* cp = static_cast<const char*>(ct->data);
  const char* sp = static_cast<const char*>(st->data);
  float* out = static_cast<float*>(dst->data);
  // Tables [T, D], or [B, T, D] (per sequence): the byte offset of row (b, tt).
  const bool per_row = ct->shape.ndim() == 3;
  const int td = per_row ? 1 : 0;  // the tables' position dim
  auto table_row = [&](const TensorNode* tab, int64_t bb, int64_t pos) {
    return (per_row ? bb * tab->stride[0] : 0) + pos * tab->stride[size_t(td)];
  };
  // Row i = (b, tt, hh), walked in order; the table rows change with tt only.
  int64_t b = r.begin / (T * H), tt = r.begin / H % T, hh = r.begin % H;
  const float *c = nullptr, *s = nullptr;
  for (int64_t i = r.begin; i < r.end; ++i) {
    if (c == nullptr || hh == 0) {
      c = f32_row(cp + table_row(ct, b, tt), ct->dtype, ct->stride[size_t(td + 1)], D, buf + D);
      s = f32_row(sp + table_row(st, b, tt), st->dtype, st->stride[size_t(td + 1)], D, buf + 2 * D);
    }
    const char* xrow = xp + b * x->stride[0] + tt * x->stride[1] + hh * x->stride[2];
    const float* xr = f32_row(xrow, x->dtype, x->stride[3], D, buf);
    float* y = out + i * D;
    if (++hh == H) {
      hh = 0;
      if (++tt == T) tt = 0, ++b;
    }
    for (int64_t j = 0; j < h; j += kW) {
      const int n = int(std::min(kW, h - j));
      const VF a = vm::loadv<VF>(xr + j, n), e = vm::loadv<VF>(xr + j + h, n);
      const VF c0 = vm::loadv<VF>(c + j, n), c1 = vm::loadv<VF>(c + j + h, n);
      const VF s0 = vm::loadv<VF>(s + j, n), s1 = vm::loadv<VF>(s + j + h, n);
      if constexpr (kBack) {
        vm::store(y + j, a * c0 + e * s1, n);
        vm::store(y + j + h, e * c1 - a * s0, n);
      } else {
        vm::store(y + j, a * c0 - e * s0, n);
        vm::store(y + j + h, e * c1 + a * s1, n);
      }
    }
  }
}

}  // namespace

void kernel_ROPE(TensorNode* dst, ThreadCtx& t) { rope_rows<false>(dst, t); }

void kernel_ROPE_BACK(TensorNode* dst, ThreadCtx& t) { rope_rows<true>(dst, t); }

}  // namespace kiln::cpu
