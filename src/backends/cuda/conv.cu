// Convolution: IM2COL, COL2IM, CONV2D (+ BACK_INPUT, BACK_WEIGHT). Inputs have
// any strides; dst is contiguous.
//
// CONV2D runs as im2col into the workspace plus one strided-batched cuBLAS GEMM
// over the images; BACK_INPUT as one batched GEMM (W^T @ dy[n]) plus col2im;
// BACK_WEIGHT unfolds the whole batch side by side ([CKK, N*P]) so dW is a
// single GEMM with K = N*P. Every scatter of the CPU kernels (col2im, the
// pooling backward ops) is a gather here: each dst element sums its
// contributions itself in a fixed order (kh, kw or oh, ow ascending), so nothing
// races and no atomics are needed.
#include "backends/cuda/common.cuh"
#include "backends/cuda/gemm_plan.h"
#include "backends/cuda/params.h"
#include "backends/cuda/window.cuh"
#include "kiln/error.h"
#include "kiln/ext/tensor_node.h"

namespace kiln::cuda {
namespace {

// Unfolded element (n, r, q) -> out[n*on + r*orow + q], r = (c*KH + kh)*KW + kw,
// q = oh*OW + ow; zero in the padding.
__global__ void k_im2col(Planes x, Geom g, int64_t on, int64_t orow, float* out, int64_t total) {
  const int64_t p = g.p(), ckk = g.ckk(), kk = g.kk();
  KILN_GRID_LOOP(i, total) {
    const int64_t q = i % p, r = (i / p) % ckk, n = i / (p * ckk);
    const int64_t c = r / kk, kh = (r % kk) / g.win.kw, kw = r % g.win.kw;
    const int64_t ih = (q / g.ow) * g.win.sh - g.win.ph + kh * g.win.dh;
    const int64_t iw = (q % g.ow) * g.win.sw - g.win.pw + kw * g.win.dw;
    float v = 0.0f;
    if (ih >= 0 && ih < g.h && iw >= 0 && iw < g.w)
      v = ldf(x.p, n * x.sn + c * x.sc + ih * x.sh + iw * x.sw);
    out[n * on + r * orow + q] = v;
  }
}

// dx[n, c, ih, iw] = sum over (kh, kw) of the column element that reads it.
// cols: byte strides cn (image), cr (row r), cq (column q).
__global__ void k_col2im(const char* cols, int64_t cn, int64_t cr, int64_t cq, Geom g, float* dx,
                         int64_t total) {
  KILN_GRID_LOOP(i, total) {
    const int64_t iw = i % g.w, ih = (i / g.w) % g.h, c = (i / (g.w * g.h)) % g.c,
                  n = i / (g.w * g.h * g.c);
    float acc = 0.0f;
    for (int64_t kh = 0; kh < g.win.kh; ++kh) {
      const int64_t yh = ih + g.win.ph - kh * g.win.dh;
      if (yh < 0 || yh % g.win.sh != 0 || yh / g.win.sh >= g.oh) continue;
      for (int64_t kw = 0; kw < g.win.kw; ++kw) {
        const int64_t yw = iw + g.win.pw - kw * g.win.dw;
        if (yw < 0 || yw % g.win.sw != 0 || yw / g.win.sw >= g.ow) continue;
        const int64_t r = (c * g.win.kh + kh) * g.win.kw + kw,
                      q = (yh / g.win.sh) * g.ow + yw / g.win.sw;
        acc += ldf(cols, n * cn + r * cr + q * cq);
      }
    }
    dx[i] = acc;
  }
}

// A [rows, cols] f32 matrix view of dims (rd, rd+1, ...) of t (columns = later
// dims merged row-major) as it lies when cuBLAS can read it (matrix_view in
// gemm_plan.h), else a dense f32 copy of t in `buf`. Returns the element row
// stride and the element stride between consecutive leading indices.
struct Mat {
  const float* p;
  int64_t rs, bs;
};
Mat as_matrix(const TensorNode* t, int rd, float* buf, const Launch& L) {
  const int nd = t->shape.ndim();
  int64_t shape[kMaxDims] = {};
  for (int d = 0; d < nd; ++d) shape[d] = t->shape[d];
  MatrixView v;
  if (matrix_view(t->dtype, nd, shape, t->stride.data(), rd, &v))
    return {static_cast<const float*>(t->data), v.rs, v.bs};
  gather_f32(static_cast<const char*>(t->data), t->dtype, idx_of(t), t->numel(), buf, L);
  int64_t cols = 1;
  for (int d = nd - 1; d > rd; --d) cols *= t->shape[d];
  return {buf, cols, rd > 0 ? t->shape[rd] * cols : 0};
}

void conv2d(TensorNode* dst, const Launch& L) {
  const TensorNode *x = dst->src[0], *wt = dst->src[1];
  const Geom g = geom(x->shape, prm::window(dst, true));
  const int64_t p = g.p(), ckk = g.ckk(), o = wt->shape[0];
  float* cols = reinterpret_cast<float*>(L.ws);
  float* wbuf = cols + g.n * ckk * p;
  const int64_t total = g.n * ckk * p;
  k_im2col<<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), g, ckk * p, p, cols, total);
  check_launch("conv2d");
  const Mat wm = as_matrix(wt, 0, wbuf, L);
  // y[n] [O, P] = W [O, CKK] @ cols[n] [CKK, P]
  gemm(L, o, p, ckk, g.n, {wm.p, CUDA_R_32F, wm.rs, 1, 0}, {cols, CUDA_R_32F, p, 1, ckk * p},
       static_cast<float*>(dst->data), p, o * p);
}

void conv2d_back_input(TensorNode* dst, const Launch& L) {
  const TensorNode *dy = dst->src[0], *wt = dst->src[1];
  const Geom g = geom(dst->shape, prm::window(dst, true));
  const int64_t p = g.p(), ckk = g.ckk(), o = wt->shape[0];
  float* cols = reinterpret_cast<float*>(L.ws);
  float* wbuf = cols + g.n * ckk * p;
  float* dybuf = wbuf + wt->numel();
  const Mat wm = as_matrix(wt, 0, wbuf, L);
  const Mat dm = as_matrix(dy, 1, dybuf, L);  // per image [O, P]
  // cols[n] [CKK, P] = W^T [CKK, O] @ dy[n] [O, P]
  gemm(L, ckk, p, o, g.n, {wm.p, CUDA_R_32F, 1, wm.rs, 0}, {dm.p, CUDA_R_32F, dm.rs, 1, dm.bs},
       cols, p, ckk * p);
  const int64_t total = dst->numel();
  k_col2im<<<grid_for(total), kThreads, 0, L.stream>>>(reinterpret_cast<const char*>(cols),
                                                       ckk * p * 4, p * 4, 4, g,
                                                       static_cast<float*>(dst->data), total);
  check_launch("conv2d_back_input");
}

// out[j] = sum over images n (in order within each lane, lanes combined in a
// fixed shuffle order) of part[n * m + j]: one warp per output element.
__global__ void k_sum_images(const float* part, int64_t n, int64_t m, float* out) {
  const int64_t j = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = int(threadIdx.x) & 31;
  if (j >= m) return;  // whole warps leave together (blockDim is a multiple of 32)
  float acc = 0.0f;
  for (int64_t i = lane; i < n; i += 32) acc += part[i * m + j];
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if (lane == 0) out[j] = acc;
}

void conv2d_back_weight(TensorNode* dst, const Launch& L) {
  const TensorNode *x = dst->src[0], *dy = dst->src[1];
  const Geom g = geom(x->shape, prm::window(dst, true));
  const int64_t p = g.p(), ckk = g.ckk(), o = dst->shape[0], m = o * ckk;
  float* cols = reinterpret_cast<float*>(L.ws);  // per image [CKK, P]
  float* part = cols + g.n * ckk * p;            // per image dW_n [O, CKK]
  float* dybuf = part + g.n * m;                 // dy, when cuBLAS cannot read it
  const int64_t total = g.n * ckk * p;
  k_im2col<<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), g, ckk * p, p, cols, total);
  check_launch("conv2d_back_weight");
  const Mat dm = as_matrix(dy, 1, dybuf, L);  // per image [O, P]
  // dW_n [O, CKK] = dy[n] [O, P] @ cols[n]^T [P, CKK], one batched GEMM over the
  // images, then the images summed in order. One GEMM over the batch side by
  // side (K = N*P, [O, CKK] out) leaves cuBLAS one or two tiles of output to
  // split over the GPU: the MNIST cnn's weight gradients took most of its step.
  gemm(L, o, ckk, p, g.n, {dm.p, CUDA_R_32F, dm.rs, 1, dm.bs}, {cols, CUDA_R_32F, 1, p, ckk * p},
       part, ckk, m);
  k_sum_images<<<grid_for(m * 32), kThreads, 0, L.stream>>>(part, g.n, m,
                                                            static_cast<float*>(dst->data));
  check_launch("conv2d_back_weight (sum)");
}

}  // namespace

size_t conv_workspace(const TensorNode* dst) {
  switch (dst->op) {
    case Op::CONV2D: {
      const Geom g = geom(dst->src[0]->shape, prm::window(dst, true));
      return size_t(g.n * g.ckk() * g.p() + dst->src[1]->numel()) * 4;
    }
    case Op::CONV2D_BACK_INPUT: {
      const Geom g = geom(dst->shape, prm::window(dst, true));
      return size_t(g.n * g.ckk() * g.p() + dst->src[1]->numel() + dst->src[0]->numel()) * 4;
    }
    case Op::CONV2D_BACK_WEIGHT: {
      const Geom g = geom(dst->src[0]->shape, prm::window(dst, true));
      return size_t(g.n * g.ckk() * g.p() + g.n * dst->numel() + dst->src[1]->numel()) * 4;
    }
    default: return 0;
  }
}

void conv_ops(TensorNode* dst, const Launch& L) {
  const int64_t total = dst->numel();
  if (total == 0) return;
  float* out = static_cast<float*>(dst->data);
  switch (dst->op) {
    case Op::IM2COL: {
      const TensorNode* x = dst->src[0];
      const Geom g = geom(x->shape, prm::window(dst, true));
      k_im2col<<<grid_for(total), kThreads, 0, L.stream>>>(planes(x), g, g.ckk() * g.p(), g.p(),
                                                           out, total);
      return check_launch("im2col");
    }
    case Op::COL2IM: {
      const TensorNode* c = dst->src[0];
      const Geom g = geom(dst->shape, prm::window(dst, true));
      k_col2im<<<grid_for(total), kThreads, 0, L.stream>>>(static_cast<const char*>(c->data),
                                                           c->stride[0], c->stride[1], c->stride[2],
                                                           g, out, total);
      return check_launch("col2im");
    }
    case Op::CONV2D: return conv2d(dst, L);
    case Op::CONV2D_BACK_INPUT: return conv2d_back_input(dst, L);
    case Op::CONV2D_BACK_WEIGHT: return conv2d_back_weight(dst, L);
    default: fail("cuda", "conv_ops got ", op_name(dst->op));
  }
}

OpKernel conv_kernel(Op op) {
  switch (op) {
    case Op::IM2COL:
    case Op::COL2IM: return {all_f32, conv_ops};
    case Op::CONV2D:
    case Op::CONV2D_BACK_INPUT:
    case Op::CONV2D_BACK_WEIGHT: return {all_f32, conv_ops, conv_workspace};
    default: return {};
  }
}

}  // namespace kiln::cuda
