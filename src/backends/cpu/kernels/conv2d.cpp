// Fused convolution kernels: CONV2D, CONV2D_BACK_INPUT, CONV2D_BACK_WEIGHT.
//
// Each image is unfolded into columns [C*KH*KW, OH*OW] (window.h's im2col_row)
// in a per-thread buffer that stays in L2, and multiplied right away:
//   CONV2D              y[n]  = W [O, CKK] @ cols(x[n])
//   CONV2D_BACK_INPUT   dx[n] = col2im(W^T @ dy[n])
//   CONV2D_BACK_WEIGHT  dW    = sum_n dy[n] @ cols(x[n])^T (8 images per product)
// so the unfolded batch (KH*KW times the input) never goes through memory.
// bf16 sources (the bf16 precision policy casts x, weight and dy): an image is
// converted to f32 to be unfolded, and its columns are stored as bf16 (exact:
// they are copies of bf16 values) so that gemm multiplies bf16 by bf16
// (vdpbf16ps where the build has AVX512_BF16); accumulation and results f32.
// Images are dealt out whole to threads, each running gemm alone (no barrier
// per image); with fewer images than threads the extra threads idle. dW sums
// images in fixed groups (the grouping depends only on N), group partials are
// added in group order: results are the same bits for any thread count.
#include <algorithm>
#include <cstring>

#include "backends/cpu/gemm.h"
#include "backends/cpu/gemm_internal.h"
#include "backends/cpu/kernels/common.h"
#include "backends/cpu/kernels/kernels.h"
#include "backends/cpu/kernels/window.h"

namespace kiln::cpu {

using namespace window;

namespace {

// The sizes of one convolution, from x [N,C,H,W] and weight [O,C,KH,KW].
struct Conv {
  Window win;
  int64_t n, c, h, w, o, oh, ow, p, ckk;
  Conv(const Conv2dParams& prm, const Shape& x, const Shape& wt)
      : win(prm), n(x[0]), c(x[1]), h(x[2]), w(x[3]), o(wt[0]) {
    oh = win.out_h(h);
    ow = win.out_w(w);
    p = oh * ow;
    ckk = c * win.kh * win.kw;
  }
};

// Dims (rd, rd+1, ...) of t at byte offset `base` as a matrix: rows along dim rd,
// columns the later dims merged row-major. When those do not merge (a strided
// view), the matrix is copied into buf and that copy is returned.
struct Mat {
  const float* p;
  int64_t rs;  // row stride in floats; columns are contiguous
};

Mat as_matrix(const TensorNode* t, const char* base, int rd, float* buf) {
  const int nd = t->shape.ndim();
  int64_t expect = sizeof(float), cols = 1;
  bool merged = true;
  for (int d = nd - 1; d > rd; --d) {
    if (t->shape[d] != 1 && t->stride[d] != expect) merged = false;
    expect *= t->shape[d];
    cols *= t->shape[d];
  }
  if (merged) return {reinterpret_cast<const float*>(base), t->stride[rd] / int64_t(sizeof(float))};
  for (int64_t i = 0; i < t->shape[rd]; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      int64_t rem = j, off = i * t->stride[rd];
      for (int d = nd - 1; d > rd; --d) {
        off += (rem % t->shape[d]) * t->stride[d];
        rem /= t->shape[d];
      }
      buf[i * cols + j] = ld(base + off);
    }
  }
  return {buf, cols};
}

// The bf16 counterpart of as_matrix (bf16 elements, buf for a strided view).
struct Mat16 {
  const uint16_t* p;
  int64_t rs;
};
Mat16 as_matrix_bf16(const TensorNode* t, const char* base, int rd, uint16_t* buf) {
  const int nd = t->shape.ndim();
  int64_t expect = 2, cols = 1;
  bool merged = true;
  for (int d = nd - 1; d > rd; --d) {
    if (t->shape[d] != 1 && t->stride[d] != expect) merged = false;
    expect *= t->shape[d];
    cols *= t->shape[d];
  }
  if (merged) return {reinterpret_cast<const uint16_t*>(base), t->stride[rd] / 2};
  for (int64_t i = 0; i < t->shape[rd]; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      int64_t rem = j, off = i * t->stride[rd];
      for (int d = nd - 1; d > rd; --d) {
        off += (rem % t->shape[d]) * t->stride[d];
        rem /= t->shape[d];
      }
      std::memcpy(buf + i * cols + j, base + off, 2);
    }
  }
  return {buf, cols};
}

// A matrix operand of gemm from dims (rd, ...) of t (f32 or bf16) at base;
// transposed: its transpose. buf holds a strided view's copy (f32-sized).
GemmOperand operand(const TensorNode* t, const char* base, int rd, void* buf, bool transposed) {
  int64_t rs = 0;
  const void* p = nullptr;
  GemmType ty = GemmType::f32;
  if (t->dtype == DType::bf16) {
    const Mat16 m = as_matrix_bf16(t, base, rd, static_cast<uint16_t*>(buf));
    p = m.p, rs = m.rs, ty = GemmType::bf16;
  } else {
    const Mat m = as_matrix(t, base, rd, static_cast<float*>(buf));
    p = m.p, rs = m.rs;
  }
  return transposed ? GemmOperand{p, ty, 1, rs} : GemmOperand{p, ty, rs, 1};
}

// Images [begin, end) of this thread: whole images, as many threads as have work.
Range my_images(const ThreadCtx& t, const Conv& cv) {
  const int k = useful_threads(cv.n, t.nth, cv.o * cv.p * cv.ckk);
  if (t.ith >= k) return {0, 0};
  return split_range(cv.n, t.ith, k);
}

// Image n's columns [ckk, p] into cols, rows ld floats apart. A bf16 image is
// converted into img (c*h*w floats) first.
void unfold(const TensorNode* xt, const Planes& x, const Conv& cv, int64_t n, float* cols,
            int64_t ld, float* img) {
  const int64_t kk = cv.win.kh * cv.win.kw;
  if (xt->dtype == DType::f32) {
    for (int64_t r = 0; r < cv.ckk; ++r)
      im2col_row(x.plane(n, r / kk), x.sh, x.sw, cv.h, cv.w, cv.win, (r % kk) / cv.win.kw,
                 r % cv.win.kw, cv.oh, cv.ow, cols + r * ld);
    return;
  }
  for (int64_t c = 0; c < cv.c; ++c)
    for (int64_t i = 0; i < cv.h; ++i)
      convert(x.plane(n, c) + i * x.sh, xt->dtype, x.sw,
              reinterpret_cast<char*>(img + (c * cv.h + i) * cv.w), DType::f32, 4, cv.w);
  const int64_t sh = cv.w * 4;
  for (int64_t r = 0; r < cv.ckk; ++r)
    im2col_row(reinterpret_cast<const char*>(img + r / kk * cv.h * cv.w), sh, 4, cv.h, cv.w, cv.win,
               (r % kk) / cv.win.kw, r % cv.win.kw, cv.oh, cv.ow, cols + r * ld);
}

// Whether gemm would multiply these args as bf16 pairs (vdpbf16ps): only its
// blocked path on AVX512_BF16 builds does; the few-rows / few-columns paths and
// other builds convert bf16 to f32, so bf16 columns there would be a detour
// (the f32 columns hold the same bf16 values: the products are the same).
bool gemm_pairs_bf16(const GemmArgs& g) {
#if defined(KILN_GEMM_BF16)
  return !gemm_detail::small_m_applicable(g) && !gemm_detail::small_n_applicable(g);
#else
  (void)g;
  return false;
#endif
}

// Rows [0, m) of f32 cols (ld floats apart, n wide) as bf16 into c16 (same ld).
void cols_to_bf16(const float* cols, int64_t m, int64_t n, int64_t ld, uint16_t* c16) {
  for (int64_t r = 0; r < m; ++r)
    convert(reinterpret_cast<const char*>(cols + r * ld), DType::f32, 4,
            reinterpret_cast<char*>(c16 + r * ld), DType::bf16, 2, n);
}

GemmOperand f32_operand(const float* p, int64_t rs, int64_t cs) {
  return {p, GemmType::f32, rs, cs};
}

}  // namespace

void kernel_CONV2D(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *x = dst->src[0], *wt = dst->src[1];
  const Conv cv(op_params<Conv2dParams>(*dst), x->shape, wt->shape);
  const Range r = my_images(t, cv);
  if (r.begin >= r.end) return;
  const bool bf = x->dtype == DType::bf16;  // bf16 columns (and image buffer)
  const int64_t img = bf ? cv.c * cv.h * cv.w : 0, c16 = bf ? (cv.ckk * cv.p + 1) / 2 : 0;
  float* buf = static_cast<float*>(
      t.scratch(size_t(cv.ckk * cv.p + cv.o * cv.ckk + img + c16) * sizeof(float)));
  float* cols = buf;
  float* ibuf = buf + cv.ckk * cv.p + cv.o * cv.ckk;
  uint16_t* cols16 = reinterpret_cast<uint16_t*>(ibuf + img);
  const GemmOperand wm =
      operand(wt, static_cast<const char*>(wt->data), 0, buf + cv.ckk * cv.p, false);
  const Planes xp(x);
  for (int64_t n = r.begin; n < r.end; ++n) {
    unfold(x, xp, cv, n, cols, cv.p, ibuf);
    GemmArgs g{};
    g.M = cv.o, g.N = cv.p, g.K = cv.ckk;
    g.A = wm;
    g.B = f32_operand(cols, cv.p, 1);
    if (bf && gemm_pairs_bf16(g)) {
      cols_to_bf16(cols, cv.ckk, cv.p, cv.p, cols16);
      g.B = {cols16, GemmType::bf16, cv.p, 1};
    }
    g.C = static_cast<float*>(dst->data) + n * cv.o * cv.p;
    g.ldc = cv.p;
    gemm_alone(g);
  }
}

void kernel_CONV2D_BACK_INPUT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *dy = dst->src[0], *wt = dst->src[1];
  const Conv cv(op_params<Conv2dParams>(*dst), dst->shape, wt->shape);
  const Range r = my_images(t, cv);
  if (r.begin >= r.end) return;
  const int64_t kk = cv.win.kh * cv.win.kw;
  float* buf = static_cast<float*>(
      t.scratch(size_t(cv.ckk * cv.p + cv.o * cv.ckk + cv.o * cv.p) * sizeof(float)));
  float* cols = buf;
  float* dy_buf = buf + cv.ckk * cv.p + cv.o * cv.ckk;
  const GemmOperand wm =
      operand(wt, static_cast<const char*>(wt->data), 0, buf + cv.ckk * cv.p, true);
  for (int64_t n = r.begin; n < r.end; ++n) {
    GemmArgs g{};  // cols [ckk, p] = W^T [ckk, O] @ dy[n] [O, p]
    g.M = cv.ckk, g.N = cv.p, g.K = cv.o;
    g.A = wm;
    g.B = operand(dy, static_cast<const char*>(dy->data) + n * dy->stride[0], 1, dy_buf, false);
    g.C = cols;
    g.ldc = cv.p;
    gemm_alone(g);
    float* dx = static_cast<float*>(dst->data) + n * cv.c * cv.h * cv.w;
    for (int64_t c = 0; c < cv.c; ++c)
      col2im_plane(reinterpret_cast<const char*>(cols + c * kk * cv.p),
                   cv.p * int64_t(sizeof(float)), sizeof(float), cv.h, cv.w, cv.win, cv.oh, cv.ow,
                   dx + c * cv.h * cv.w);
  }
}

void kernel_CONV2D_BACK_WEIGHT(TensorNode* dst, ThreadCtx& t) {
  const TensorNode *x = dst->src[0], *dy = dst->src[1];
  const Conv cv(op_params<Conv2dParams>(*dst), x->shape, dst->shape);
  // Images are summed in kGroups fixed groups; group 0 sums into dst, the others
  // into shared partials that are then added to dst in group order. Within a
  // group, kBatch images at a time form one product with K = kBatch*p (their
  // columns and dy side by side): C is small and K long, so gemm takes
  // dot products, and their final reductions are paid once per kBatch images.
  constexpr int64_t kGroups = 8, kBatch = 8;
  const int64_t groups = std::min(cv.n, kGroups), wsize = cv.o * cv.ckk;
  float* dw = static_cast<float*>(dst->data);
  float* partials =
      groups > 1
          ? static_cast<float*>(t.shared_scratch(size_t((groups - 1) * wsize) * sizeof(float)))
          : nullptr;
  const int k = useful_threads(groups, t.nth, (cv.n / groups) * cv.o * cv.p * cv.ckk);
  if (t.ith < k) {
    const Range gr = split_range(groups, t.ith, k);
    const int64_t kmax = kBatch * cv.p;  // row length of the side-by-side buffers
    // bf16 x and dy: the side-by-side buffers are kept as bf16 for gemm when it
    // multiplies bf16 pairs (decided on a full batch of images).
    GemmArgs full{};
    full.M = cv.o, full.N = cv.ckk, full.K = kmax;
    full.A = {nullptr, GemmType::bf16, kmax, 1};
    full.B = {nullptr, GemmType::bf16, 1, kmax};
    const bool bf = x->dtype == DType::bf16 && dy->dtype == DType::bf16 && gemm_pairs_bf16(full);
    const int64_t img = x->dtype == DType::bf16 ? cv.c * cv.h * cv.w : 0;
    const int64_t b16 = bf ? ((cv.ckk + cv.o) * kmax + 1) / 2 : 0;
    float* buf = static_cast<float*>(
        t.scratch(size_t(cv.ckk * kmax + cv.o * kmax + cv.o * cv.p + img + b16) * sizeof(float)));
    float* cols = buf;                  // [ckk, kmax]
    float* dys = buf + cv.ckk * kmax;   // [o, kmax]
    float* dy_buf = dys + cv.o * kmax;  // one strided dy image, gathered
    float* ibuf = dy_buf + cv.o * cv.p;
    uint16_t* cols16 = reinterpret_cast<uint16_t*>(ibuf + img);  // [ckk, kmax]
    uint16_t* dys16 = cols16 + cv.ckk * kmax;                    // [o, kmax]
    const Planes xp(x);
    const int64_t dsz = int64_t(dtype_size(dy->dtype));
    for (int64_t gi = gr.begin; gi < gr.end; ++gi) {
      float* out = gi == 0 ? dw : partials + (gi - 1) * wsize;
      const int64_t n0 = cv.n * gi / groups, n1 = cv.n * (gi + 1) / groups;
      for (int64_t b0 = n0; b0 < n1; b0 += kBatch) {
        const int64_t nb = std::min(kBatch, n1 - b0), kb = nb * cv.p;
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t n = b0 + i;
          unfold(x, xp, cv, n, cols + i * cv.p, kb, ibuf);
          const GemmOperand dm =
              operand(dy, static_cast<const char*>(dy->data) + n * dy->stride[0], 1, dy_buf, false);
          for (int64_t o = 0; o < cv.o; ++o) {
            const char* src = static_cast<const char*>(dm.data) + o * dm.rs * dsz;
            if (bf) std::memcpy(dys16 + o * kb + i * cv.p, src, size_t(cv.p) * 2);
            else
              convert(src, dy->dtype, dsz, reinterpret_cast<char*>(dys + o * kb + i * cv.p),
                      DType::f32, 4, cv.p);
          }
        }
        GemmArgs g{};  // dW [O, ckk] (+)= dys [O, kb] @ cols^T [kb, ckk]
        g.M = cv.o, g.N = cv.ckk, g.K = kb;
        g.A = f32_operand(dys, kb, 1);
        g.B = f32_operand(cols, 1, kb);
        if (bf) {
          cols_to_bf16(cols, cv.ckk, kb, kb, cols16);
          g.A = {dys16, GemmType::bf16, kb, 1};
          g.B = {cols16, GemmType::bf16, 1, kb};
        }
        g.C = out;
        g.ldc = cv.ckk;
        g.accumulate = b0 > n0;
        gemm_alone(g);
      }
    }
  }
  if (groups <= 1) return;
  t.barrier();  // every group's sum is written
  const Range er = thread_range(t, wsize, groups);
  for (int64_t i = er.begin; i < er.end; ++i) {
    float s = dw[i];
    for (int64_t gi = 1; gi < groups; ++gi) s += partials[(gi - 1) * wsize + i];
    dw[i] = s;
  }
}

}  // namespace kiln::cpu
